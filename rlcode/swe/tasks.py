"""An executable PR task: its Task, its workspace, and the tree its tests run on.

- `make_task`: a mined PR as a `Task` of kind "swe" (rlcode.data.extras.SweExtra). Its
  prompt is for a single-turn answer: the request and the base text of the code files the
  gold patch touches (SWE-bench's "oracle" files), in the task's edit format
  (rlcode.data.edits.build_prompt); an agent episode shows `statement` instead and lets the
  tools find the files.
- `base_files`: the repository's text files at the base commit, read from the task's
  history (cached): an episode's workspace, and what answers apply to.
- `candidate_changes`: the files a completion changes (in the task's edit format).
- `evaluation_tree`: what the tests run on, as SWE-bench builds it: the base, the
  candidate's changes, then the test patch. A candidate's changes to test paths (the test
  files, conftest.py) are dropped, so the tests are the task's, and so are its
  sitecustomize.py, usercustomize.py and .pth files (pytest runs without the site module
  anyway, rlcode.swe.runner).
- `run_spec`: the pytest run of a tree for a task.

This module must not score (rlcode.rewards.swe) nor mine (rlcode.swe.mining).
"""

from __future__ import annotations

import functools
import posixpath
import types
from collections.abc import Mapping

from rlcode import paths
from rlcode.data import edits
from rlcode.data.git.repo import Git, checkout
from rlcode.data.tasks import Task
from rlcode.swe import history, patches
from rlcode.swe.runner import RunSpec

_NOT_CODE = ("sitecustomize.py", "usercustomize.py")


def statement(task: Task) -> str:
  """The request an agent episode starts from (the workspace holds the repository)."""
  return (f"The repository {task.extra.repo_name or 'in the workspace'} is checked out in "
          "the workspace. Change its code so that the request below is met; its tests "
          "will be run on your changes.\n\n--- BEGIN REQUEST ---\n"
          f"{request_of(task)}\n--- END REQUEST ---")


def request_of(task: Task) -> str:
  return task.prompt.split("--- BEGIN REQUEST ---\n", 1)[-1].split(
      "\n--- END REQUEST ---", 1)[0]


def make_task(*, instance_id: str, request: str, repo: str, repo_name: str, base_commit: str,
              commit: str, time: int, base: Mapping[str, str], code_after: Mapping[str, str | None],
              tests_after: Mapping[str, str | None], fail_to_pass, pass_to_pass, test_files,
              test_deps, python_path, hypothesis_examples: int, timeout: float,
              edit_format: str, gold_runs: int = 0) -> Task:
  """The Task of a validated PR (module docstring)."""
  code_after = {p: t for p, t in code_after.items() if base.get(p) != t}
  shown = {p: base.get(p, "") for p in code_after}
  new = [p for p in code_after if p not in base]
  prompt = edits.build_prompt(request, shown, edit_format, new)
  gold = patches.render(base, code_after)
  return Task(
      id=instance_id, prompt=prompt, kind="swe",
      reference=edits.oracle_completion(shown, {p: t or "" for p, t in code_after.items()},
                                        edit_format),
      extra={"repo": repo, "repo_name": repo_name, "base_commit": base_commit,
             "commit": commit, "patch": gold, "test_patch": patches.render(base, tests_after),
             "fail_to_pass": sorted(fail_to_pass), "pass_to_pass": sorted(pass_to_pass),
             "test_files": list(test_files), "test_deps": list(test_deps),
             "python_path": list(python_path), "hypothesis_examples": hypothesis_examples,
             "timeout": timeout, "time": time, "edit_format": edit_format,
             "gold_runs": gold_runs})


@functools.lru_cache(maxsize=16)
def _tree(repo: str, commit: str) -> Mapping[str, str]:
  git = Git(checkout(paths.resolve(repo)))
  with git.blobs() as blobs:
    return types.MappingProxyType(history.Reader(git, blobs).tree(commit))


def base_files(task: Task) -> Mapping[str, str]:
  """The repository's text files at the task's base commit (read-only, cached)."""
  return _tree(task.extra.repo, task.extra.base_commit)


def gold_changes(task: Task, base: Mapping[str, str] | None = None) -> dict[str, str | None]:
  """The files the gold patch changes: path -> new text (None: deleted)."""
  return patches.apply(base if base is not None else base_files(task), task.extra.patch)


def candidate_changes(task: Task, completion: str,
                      base: Mapping[str, str] | None = None) -> dict[str, str]:
  """path -> new text of the files a completion (in the task's edit format) changes.

  Raises:
    edits.FormatError: the completion does not parse or apply.
  """
  base = base if base is not None else base_files(task)
  return edits.apply_completion(completion, base, task.extra.edit_format)


def _dropped(path: str) -> bool:
  return (patches.is_test_path(path) or posixpath.basename(path) in _NOT_CODE
          or path.endswith(".pth"))


def evaluation_tree(base: Mapping[str, str], test_patch: str,
                    changes: Mapping[str, str | None]) -> dict[str, str]:
  """The base, the candidate's changes (test paths and site hooks dropped), then the test
  patch (module docstring). Raises edits.FormatError if the test patch does not apply."""
  tree = dict(base)
  for path, text in changes.items():
    if _dropped(path):
      continue
    if text is None:
      tree.pop(path, None)
    else:
      tree[path] = text
  return patches.applied(tree, test_patch)


def run_spec(task: Task, tree: Mapping[str, str], tests: tuple[str, ...] | None = None,
             attempt: int = 0) -> RunSpec:
  """The pytest run of `tree` for `task` (its test files unless `tests` are given)."""
  x = task.extra
  return RunSpec(files=tree, tests=tuple(x.test_files) if tests is None else tests,
                 deps=tuple(x.test_deps), python_path=tuple(x.python_path),
                 timeout=x.timeout, hypothesis_examples=x.hypothesis_examples,
                 attempt=attempt)
