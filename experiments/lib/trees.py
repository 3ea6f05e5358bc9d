"""Earlier commits of this repository, checked out beside it for side-by-side runs."""

from __future__ import annotations

import os
import subprocess

from experiments.lib import ROOT


def baseline_tree(commit: str, path: str) -> str:
  """A detached git worktree of this repository at `commit`, at `path` (added if absent,
  moved to `commit` if it holds another); `commit`'s full hash."""
  found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                         cwd=ROOT, check=False, capture_output=True, text=True)
  if found.returncode:
    raise ValueError(f"--baseline-commit {commit!r} is not a commit of {ROOT}")
  sha = found.stdout.strip()
  path = os.path.abspath(path)
  git = lambda *a, check=True: subprocess.run(["git", *a], cwd=path, check=check,
                                              capture_output=True, text=True).stdout.strip()
  if not os.path.exists(path):
    # --force: a worktree once registered here and deleted by hand is added again.
    subprocess.run(["git", "worktree", "add", "--force", "--detach", path, sha], cwd=ROOT,
                   check=True, capture_output=True)
  elif (not os.path.isdir(path) or os.path.realpath(git("rev-parse", "--show-toplevel",
                                                        check=False)) != os.path.realpath(path)):
    # git in a plain folder inside the repository would act on the main checkout.
    raise ValueError(f"{path} is in the way of the baseline worktree: it exists and is not "
                     "a git worktree; remove it")
  elif git("rev-parse", "HEAD") != sha:
    git("checkout", "--quiet", "--detach", sha)
  return sha
