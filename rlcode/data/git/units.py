"""Decomposition: a PR into pr, commit, file or hunk units, and a unit into a Task.

A PR (rlcode.data.git.mining) is a merge commit of the first-parent chain,
with its diff against the first parent, or a first-parent non-merge commit
(a squash-merged or directly pushed change), which is its own diff.

- pr: the whole PR. Its request is the PR's title and messages.
- commit: the commits the PR is made of, each against its own parent, with its
  own message as the request: for a squash commit the PR itself; for a merge,
  each non-merge commit it brings in (oldest first), in the tree of its own
  parent, so the earlier commits of the PR are applied and the later ones are
  not, as the history made them. Commits of a merged branch can start from an
  older base than the first parent; they keep that base (it is the state the
  author edited), and a commit that the filters reject only drops its unit.
- file and hunk: cut from the PR's whole diff. A file task of a PR touching A
  and B shows B already in its post-change state, A in its pre-change state,
  and the part already made as a unified diff in the prompt; a hunk task does
  the same with the other hunks of its file applied too. The oracle is the
  unit's file after the PR, so every unit's oracle applied to its context
  gives the PR's post-change files.

The oracle is always expressible in the task's edit format: the reference
answer is rendered and applied back (`validate`), and a unit whose answer does
not reproduce the oracle is dropped: a "=======" line can cut a SEARCH/REPLACE
block short, and text containing <think> or <solution> breaks the
one-tag-each rule of every answer.

Tests (MiningConfig.tests_hidden): a unit carries the test files of its
commit's post-change tree: `task.tests` is the hidden test files concatenated
in path order (script format: top-level asserts, each one test, that import
the package they test), `extra["tests_visible"]` the visible ones likewise,
`extra["tests_format"]` "script",
`extra["support_files"]` the source files the tests import that the task does
not edit (at the same state), and `extra["assemble"]` "files": the tests
reward applies the completion to `extra["files"]` and runs the tests against
those files plus the support files (rlcode.rewards.tests). A diff task with
tests can so be scored by the diff reward, the tests reward, or both.

This module must not read git nor filter commits (rlcode.data.git.mining), nor
score completions (rlcode.rewards.diffs).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

from rlcode.data import edits
from rlcode.data.git.config import MiningConfig
from rlcode.data.git.excerpts import prompt_excerpts
from rlcode.data.git.repo import Commit
from rlcode.data.tasks import Task


@dataclasses.dataclass(frozen=True)
class FileChange:
  """One touched file of a change: its path and text before and after.

  `cut`: the file was larger than MiningConfig.max_file_bytes, and `pre` and
  `post` are its windows (rlcode.data.git.excerpts.window).
  """

  path: str
  pre: str
  post: str
  added: bool
  cut: bool = False


@dataclasses.dataclass(frozen=True)
class Tests:
  """The tests of one post-change tree: hidden and visible programs, support files."""

  hidden: str
  visible: str
  support: Mapping[str, str]


@dataclasses.dataclass
class Change:
  """A diff that passed every filter: a PR's, or one commit's of a merged PR."""

  commit: Commit
  request: str
  files: list[FileChange]
  related: dict[str, str]
  tests: Tests | None = None


@dataclasses.dataclass
class Pr:
  """A kept PR: its whole change, the changes of its commit units, and why others fell.

  `dropped_commits`: the commits of a merged PR that give no commit unit, by
  reason ("merge" for a merge inside the merged branch).
  """

  change: Change
  commits: list[Change]
  merge: bool
  dropped_commits: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  @property
  def sha(self) -> str:
    return self.change.commit.sha


class Skip(Exception):
  """A PR, commit or unit is not used; `reason` is one of SKIP_REASONS."""

  def __init__(self, reason: str):
    super().__init__(reason)
    self.reason = reason


@dataclasses.dataclass(frozen=True)
class Unit:
  """One task's request, context files, oracle files, added files and the part already made."""

  id: str
  commit: str
  request: str
  files: dict[str, str]
  oracle: dict[str, str]
  new_files: tuple[str, ...]
  applied_diff: str
  tests: Tests | None


def _whole(change: Change, unit_id: str) -> Unit:
  pre = {**change.related, **{f.path: f.pre for f in change.files}}
  post = {f.path: f.post for f in change.files}
  added = tuple(sorted(f.path for f in change.files if f.added))
  return Unit(unit_id, change.commit.sha, change.request, pre, post, added, "",
              change.tests)


def decompose(pr: Pr, granularity: str) -> list[Unit]:
  """The units of one PR at `granularity`, before validation."""
  if granularity == "pr":
    return [_whole(pr.change, pr.sha)]
  if granularity == "commit":
    return [_whole(c, c.commit.sha) for c in pr.commits]
  change, sha = pr.change, pr.sha
  pre = {**change.related, **{f.path: f.pre for f in change.files}}
  post = {f.path: f.post for f in change.files}
  units = []
  for f in change.files:
    if granularity == "file":
      starts = [(f"{sha}:{f.path}", f.pre)]
    else:
      a, b, hunks = edits.line_hunks(f.pre, f.post)
      # Hunk k's context: the file after the PR with hunk k undone.
      starts = [(f"{sha}:{f.path}#{k}", "".join(b[:j1] + a[i1:i2] + b[j2:]))
                for k, (i1, i2, j1, j2) in enumerate(hunks, 1)]
    for unit_id, start in starts:
      files = {**pre, **post, f.path: start}
      new = (f.path,) if f.added and not start else ()
      units.append(Unit(unit_id, sha, change.request, files, {f.path: f.post}, new,
                        edits.unified_diff_text(pre, files), change.tests))
  return units


def open_file(unit: Unit, config: MiningConfig) -> str:
  """The file a task's prompt shows alone, when `config.open_file` asks for one (line
  edits: its blocks may leave the path out); "" otherwise."""
  if not config.open_file:
    return ""
  # As make_task shows them: excerpts of the changed files, or every file whole.
  shown = unit.oracle if config.context_lines else unit.files
  return next(iter(shown)) if len(shown) == 1 else ""


def validate(unit: Unit, config: MiningConfig) -> str:
  """The unit's reference completion in `config.edit_format` (blocks with
  `config.oracle_context_lines` unchanged lines, the open file's without a path line,
  ranges as A+N with `config.line_counts`, the reasoning `config.reference_thought`'s:
  rlcode.data.edits.oracle_completion); raises Skip when it is unusable."""
  for path, content in unit.oracle.items():
    if not edits.normalized_patch(unit.files[path], content):
      raise Skip("invisible_change")
  options = dict(context_lines=config.oracle_context_lines, open_file=open_file(unit, config),
                 line_counts=config.line_counts)
  try:
    completion = edits.oracle_completion(unit.files, unit.oracle, config.edit_format, **options)
    if config.reference_thought == "locate":
      thought = edits.locating_thought(unit.files, completion, options["open_file"])
      completion = edits.oracle_completion(unit.files, unit.oracle, config.edit_format,
                                           thought=thought, **options)
    return completion
  except ValueError:
    raise Skip("oracle_not_expressible") from None


def _tests_fields(unit: Unit) -> tuple[str, dict]:
  """`task.tests` and the extra fields of a unit with tests (module docstring)."""
  if unit.tests is None or not unit.tests.hidden:
    return "", {}
  edited = set(unit.files) | set(unit.oracle)
  support = {p: t for p, t in sorted(unit.tests.support.items()) if p not in edited}
  return unit.tests.hidden, {"tests_visible": unit.tests.visible, "tests_format": "script",
                             "support_files": support, "assemble": "files"}


def make_task(pr: Pr, unit: Unit, granularity: str, reference: str,
              config: MiningConfig) -> Task:
  """The Task of a validated unit, its prompt whole or excerpted."""
  shown, applied_diff = unit.files, unit.applied_diff
  if config.context_lines:
    shown = prompt_excerpts(unit.files, unit.oracle, reference, config.edit_format,
                            config.context_lines)
    applied_diff = ""
  elif config.edit_format == "line_edit":
    shown = {p: edits.number_lines(text) for p, text in shown.items()}
  tests, tests_extra = _tests_fields(unit)
  open_path = open_file(unit, config)
  numbering = {}
  if config.line_numbers == "shown":
    counted = {p: edits.count_shown_lines(text) for p, text in shown.items()}
    shown = {p: text for p, (text, _) in counted.items()}
    numbering = {"shown_lines": {p: numbers for p, (_, numbers) in counted.items()}}
    reference = edits.shown_ranges(reference, numbering["shown_lines"], open_path)
  return Task(
      id=unit.id,
      prompt=edits.build_prompt(unit.request, shown, config.edit_format, unit.new_files,
                                applied_diff, instructions=config.instructions,
                                open_file=bool(open_path)),
      kind="diff",
      reference=reference,
      tests=tests,
      extra={
          "files": unit.files,
          "oracle": unit.oracle,
          "edit_format": config.edit_format,
          "new_files": list(unit.new_files),
          "commit": unit.commit,
          "pr": pr.sha,
          "time": pr.change.commit.time,
          "unit": granularity,
          **({"open_file": open_path} if open_path else {}),
          **numbering,
          **tests_extra,
      })
