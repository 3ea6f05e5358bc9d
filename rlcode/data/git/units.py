"""Decomposition: one change into commit, file or hunk units, and a unit into a Task.

- A file task of a commit touching A and B shows B already in its post-change
  state, A in its pre-change state, and the part already made as a unified
  diff in the prompt; a hunk task does the same with the other hunks of its
  file applied too. The oracle is the unit's file after the commit, so every
  unit's oracle applied to its context gives the commit's post-change files.
- The oracle is always expressible in the task's edit format: the reference
  answer is rendered and applied back (`validate`), and a unit whose answer
  does not reproduce the oracle is dropped: a "=======" line can cut a
  SEARCH/REPLACE block short, and text containing <think> or <solution> breaks
  the one-tag-each rule of every answer.
- Excerpts (`context_lines` > 0): whole files make byte-level prompts far
  longer than a small model's context, so a task may show only the lines near
  the changes it asks for: the files its oracle changes, each cut to the lines
  within `context_lines` of a changed line (every other run of lines becomes
  one marker line "[... lines A-B not shown ...]"), without the files it
  leaves alone and without the part of the commit already made. This tells the
  policy where to edit. `extra["files"]` stays whole, so the reward applies
  answers to the whole files; a reference SEARCH text that reaches beyond the
  excerpt (made longer to be unique) widens that task's window until it is
  shown.

This module must not read git nor filter commits (rlcode.data.git.mining), nor
score completions (rlcode.rewards.diffs).
"""

from __future__ import annotations

import dataclasses
import difflib

from rlcode.data import edits
from rlcode.data.git.config import MiningConfig
from rlcode.data.git.repo import Commit
from rlcode.data.tasks import Task

@dataclasses.dataclass(frozen=True)
class FileChange:
  """One touched file of a change: its path and text before and after."""

  path: str
  pre: str
  post: str
  added: bool


@dataclasses.dataclass
class Change:
  """A commit that passed every commit-level filter."""

  commit: Commit
  request: str
  files: list[FileChange]
  related: dict[str, str]


class Skip(Exception):
  """A commit or unit is not used; `reason` is one of SKIP_REASONS."""

  def __init__(self, reason: str):
    super().__init__(reason)
    self.reason = reason


@dataclasses.dataclass(frozen=True)
class Unit:
  """One task's context files, oracle files, files it adds and the part already made."""

  id: str
  files: dict[str, str]
  oracle: dict[str, str]
  new_files: tuple[str, ...]
  applied_diff: str


def decompose(change: Change, granularity: str) -> list[Unit]:
  """The tasks of one change at `granularity`, before validation."""
  sha = change.commit.sha
  pre = {**change.related, **{f.path: f.pre for f in change.files}}
  post = {f.path: f.post for f in change.files}
  added = {f.path for f in change.files if f.added}
  if granularity == "commit":
    return [Unit(sha, pre, post, tuple(sorted(added)), "")]
  units = []
  for f in change.files:
    if granularity == "file":
      starts = [(f"{sha}:{f.path}", f.pre)]
    else:
      a, b, hunks = edits.line_hunks(f.pre, f.post)
      # Hunk k's context: the file after the commit with hunk k undone.
      starts = [(f"{sha}:{f.path}#{k}", "".join(b[:j1] + a[i1:i2] + b[j2:]))
                for k, (i1, i2, j1, j2) in enumerate(hunks, 1)]
    for unit_id, start in starts:
      files = {**pre, **post, f.path: start}
      new = (f.path,) if f.added and not start else ()
      units.append(Unit(unit_id, files, {f.path: f.post}, new,
                        edits.unified_diff_text(pre, files)))
  return units


def validate(unit: Unit, edit_format: str) -> str:
  """The unit's reference completion; raises Skip when it is unusable."""
  for path, content in unit.oracle.items():
    if not edits.normalized_patch(unit.files[path], content):
      raise Skip("invisible_change")
  try:
    return edits.oracle_completion(unit.files, unit.oracle, edit_format)
  except ValueError:
    raise Skip("oracle_not_expressible") from None


def _excerpt(old: str, new: str, context_lines: int) -> str:
  """`old` with only the lines within `context_lines` of a change to `new`."""
  a = edits.split_keepends(old)
  shown = [False] * len(a)
  matcher = difflib.SequenceMatcher(None, a, edits.split_keepends(new))
  for tag, i1, i2, _, _ in matcher.get_opcodes():
    if tag != "equal":
      lo, hi = max(i1 - context_lines, 0), min(i2 + context_lines, len(a))
      shown[lo:hi] = [True] * (hi - lo)
  out, k = [], 0
  while k < len(a):
    end = k
    while end < len(a) and shown[end] == shown[k]:
      end += 1
    # A marker is no shorter than one line it would replace.
    if shown[k] or end - k == 1:
      out.extend(a[k:end])
    else:
      out.append(f"[... lines {k + 1}-{end} not shown ...]\n")
    k = end
  return "".join(out)


def _excerpts(unit: Unit, reference: str,
              config: MiningConfig) -> dict[str, str]:
  """The unit's changed files cut to `context_lines` around each change.

  A search_replace reference must apply to what is shown; where its SEARCH
  text reaches further, the window doubles (at worst to the whole file).
  """
  n = config.context_lines
  while True:
    shown = {p: _excerpt(unit.files.get(p, ""), unit.oracle[p], n)
             for p in sorted(unit.oracle)}
    if config.edit_format != "search_replace":
      return shown
    try:
      edits.apply_completion(reference, shown, config.edit_format)
      return shown
    except edits.FormatError:
      n *= 2


def make_task(change: Change, unit: Unit, granularity: str, reference: str,
              config: MiningConfig) -> Task:
  """The Task of a validated unit, its prompt whole or excerpted."""
  shown, applied_diff = unit.files, unit.applied_diff
  if config.context_lines:
    shown, applied_diff = _excerpts(unit, reference, config), ""
  return Task(
      id=unit.id,
      prompt=edits.build_prompt(change.request, shown, config.edit_format,
                                unit.new_files, applied_diff),
      kind="diff",
      reference=reference,
      extra={
          "files": unit.files,
          "oracle": unit.oracle,
          "edit_format": config.edit_format,
          "new_files": list(unit.new_files),
          "commit": change.commit.sha,
          "time": change.commit.time,
          "unit": granularity,
      })

