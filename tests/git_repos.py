"""A git repository made in a temp dir, for the git-mining tests.

Every commit gets its own time (T0 + 100 s per commit) and a fixed author, and
git reads no user or system configuration, so histories are the same on every
machine.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

T0 = 1_700_000_000


class Repo:
  """A git repository in a temp dir with deterministic commit times."""

  def __init__(self, path: Path):
    self.path = path
    self.time = T0
    path.mkdir(parents=True, exist_ok=True)
    self.git("init", "-q", "-b", "main")

  def env(self):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    stamp = f"@{self.time} +0000"
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com",
               GIT_AUTHOR_DATE=stamp, GIT_COMMITTER_DATE=stamp,
               GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return env

  def git(self, *args: str, stdin: bytes | None = None) -> str:
    r = subprocess.run(["git", *args], cwd=self.path, env=self.env(),
                       input=stdin, capture_output=True, check=True)
    return r.stdout.decode("utf-8", "replace").strip()

  def write(self, path: str, content: str | bytes):
    p = self.path / path
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(content.encode() if isinstance(content, str) else content)

  def commit(self, message: str, files=None, stage=()) -> str:
    """Writes and stages `files`, stages the paths `stage`, and commits."""
    self.time += 100
    for path, content in (files or {}).items():
      self.write(path, content)
    paths = [*(files or {}), *stage]
    if paths:
      self.git("add", "--", *paths)
    self.git("commit", "-q", "-m", message)
    return self.git("rev-parse", "HEAD")

  def show(self, sha: str, path: str) -> str:
    return self.git_bytes("show", f"{sha}:{path}").decode()

  def git_bytes(self, *args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=self.path, env=self.env(),
                          capture_output=True, check=True).stdout
