"""Cutting files to the lines near their changes: prompt excerpts and windows of large files.

Two cuts, one marker. Both replace a run of unchanged lines by one line
"[... lines A-B not shown ...]" (A-B: the run's 1-based line numbers in the
text that was cut; a marker is never used for a single line, which it would
not shorten):
- `window(pre, post, n)` cuts a large file's two sides alike, keeping the lines
  within `n` lines of a change. Each marker replaces the same unchanged lines
  on both sides, with the same text (numbered in `pre`), so the windowed pair
  differs exactly as the whole files do and every unit cut from it is a real
  edit of real lines. The miner stores the windows instead of the files (the
  task's world is the window), which keeps a 170 kB module's one-line change a
  task of a few kilobytes.
- `prompt_excerpts` shows only the lines near the changes a task asks for
  (`context_lines`); the task's files stay whole for the reward, and a
  reference SEARCH text that reaches beyond the excerpt (made longer to be
  unique) widens that task's window until it is shown.

This module must not read git nor decide which changes are kept.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from rlcode.data import edits


def _near_changes(a: list[str], opcodes, n: int) -> list[bool]:
  """For each line of `a`: is it within `n` lines of a line the opcodes change?"""
  shown = [False] * len(a)
  for tag, i1, i2, _, _ in opcodes:
    if tag != "equal":
      lo, hi = max(i1 - n, 0), min(i2 + n, len(a))
      shown[lo:hi] = [True] * (hi - lo)
  return shown


def _runs(shown: list[bool], start: int, stop: int):
  """(first, end, shown) of each maximal run of equal flags in shown[start:stop]."""
  k = start
  while k < stop:
    end = k
    while end < stop and shown[end] == shown[k]:
      end += 1
    yield k, end, shown[k]
    k = end


def excerpt(old: str, new: str, context_lines: int, numbered: bool = False) -> str:
  """`old` with only the lines within `context_lines` of a change to `new`;
  `numbered`: each shown line carries its number in `old` (edits.number_lines)."""
  a = edits.split_keepends(old)
  opcodes = difflib.SequenceMatcher(None, a, edits.split_keepends(new)).get_opcodes()
  shown = _near_changes(a, opcodes, context_lines)
  out = []
  for k, end, visible in _runs(shown, 0, len(a)):
    if not visible and end - k > 1:
      out.append(edits.omitted_lines(k + 1, end))
    elif numbered:
      out.append(edits.number_lines("".join(a[k:end]), first=k + 1))
    else:
      out.extend(a[k:end])
  return "".join(out)


def _opcodes(a: list[str], b: list[str]) -> list[tuple[str, int, int, int, int]]:
  """difflib's opcodes from a to b, the common first and last lines matched first.

  Most changes touch a few places of a large file; matching the common ends
  by equality first leaves SequenceMatcher only the lines between.
  """
  p = 0
  while p < min(len(a), len(b)) and a[p] == b[p]:
    p += 1
  q = 0
  while q < min(len(a), len(b)) - p and a[-1 - q] == b[-1 - q]:
    q += 1
  middle = difflib.SequenceMatcher(None, a[p:len(a) - q], b[p:len(b) - q]).get_opcodes()
  ops = [("equal", 0, p, 0, p)]
  ops += [(tag, i1 + p, i2 + p, j1 + p, j2 + p) for tag, i1, i2, j1, j2 in middle]
  ops.append(("equal", len(a) - q, len(a), len(b) - q, len(b)))
  merged: list[tuple[str, int, int, int, int]] = []
  for op in ops:
    if op[1] == op[2] and op[3] == op[4]:
      continue
    if merged and op[0] == "equal" == merged[-1][0]:
      merged[-1] = ("equal", merged[-1][1], op[2], merged[-1][3], op[4])
    else:
      merged.append(op)
  return merged


def window(pre: str, post: str, n: int) -> tuple[str, str]:
  """`pre` and `post` both cut to the lines within `n` lines of a change."""
  a, b = edits.split_keepends(pre), edits.split_keepends(post)
  opcodes = _opcodes(a, b)
  shown = _near_changes(a, opcodes, n)
  pre_out, post_out = [], []
  for tag, i1, i2, j1, j2 in opcodes:
    if tag != "equal":
      pre_out += a[i1:i2]
      post_out += b[j1:j2]
      continue
    # Inside an equal block a[i1:i2] == b[j1:j2], so one cut serves both sides.
    for k, end, visible in _runs(shown, i1, i2):
      lines = a[k:end] if visible or end - k == 1 else [edits.omitted_lines(k + 1, end)]
      pre_out += lines
      post_out += lines
  return "".join(pre_out), "".join(post_out)


def prompt_excerpts(files: Mapping[str, str], oracle: Mapping[str, str], reference: str,
                    edit_format: str, context_lines: int) -> dict[str, str]:
  """The oracle's files cut to `context_lines` around each change, as a prompt shows them.

  A search_replace reference must apply to what is shown; where its SEARCH
  text reaches further, the window doubles (at worst to the whole file). A
  line_edit prompt numbers the lines it shows.
  """
  n = context_lines
  numbered = edit_format == "line_edit"
  while True:
    shown = {p: excerpt(files.get(p, ""), oracle[p], n, numbered) for p in sorted(oracle)}
    if edit_format != "search_replace":
      return shown
    try:
      edits.apply_completion(reference, shown, edit_format)
      return shown
    except edits.FormatError:
      n *= 2
