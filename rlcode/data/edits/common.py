"""What every edit format shares: the answer's tags, FormatError, the reward's view of a
change (`normalized_patch`), and line bookkeeping.
"""

from __future__ import annotations

import difflib


EDIT_FORMATS = ("search_replace", "unified_diff", "line_edit")


THINK_START, THINK_END = "<think>", "</think>"


SOLUTION_START, SOLUTION_END = "<solution>", "</solution>"


class FormatError(ValueError):
  """A completion that does not parse or does not apply to its files.

  Attributes:
    code: a short reason, stable for aggregation ("tag_count", "empty_thought",
      "no_edits", "search_not_found", "search_equals_replace", "bad_hunk",
      "hunk_does_not_apply", "deletion").
  """

  def __init__(self, code: str, message: str):
    super().__init__(f"{code}: {message}")
    self.code = code


def normalized_patch(old: str, new: str) -> str:
  """SWE-RL's per-file diff text: unified, 3 context lines, headers removed.

  Lines are split with `str.splitlines`, as SWE-RL does, so a change that only
  touches line terminators (a final newline, CR/LF) is invisible: "".
  """
  lines = difflib.unified_diff(old.splitlines(), new.splitlines(),
                               fromfile="old", tofile="new", lineterm="", n=3)
  return "\n".join(list(lines)[2:])


def extract_thought_solution(completion: str) -> tuple[str, str]:
  """Returns the stripped (thought, solution) of a completion.

  Raises:
    FormatError: a tag does not occur exactly once, or the thought is empty.
  """
  for tag in (THINK_START, THINK_END, SOLUTION_START, SOLUTION_END):
    n = completion.count(tag)
    if n != 1:
      raise FormatError("tag_count", f"{tag} occurs {n} times, expected once")
  thought = completion.split(THINK_START)[1].split(THINK_END)[0].strip()
  solution = completion.split(SOLUTION_START)[1].split(SOLUTION_END)[0].strip()
  if not thought:
    raise FormatError("empty_thought", "the <think> block is empty")
  return thought, solution


def line_hunks(old: str, new: str, context: int = 3
               ) -> tuple[list[str], list[str], list[tuple[int, int, int, int]]]:
  """The hunks (`context` unchanged lines around each change) that take `old` to `new`.

  Returns (old lines, new lines, [(i1, i2, j1, j2), ...]): hunk k replaces
  old lines [i1, i2) by new lines [j1, j2); hunks are ordered and disjoint.

  Lines are split on "\\n" only (not `str.splitlines`), and keep it, so a
  change of the final newline is a change of the last line and rendering the
  hunks reproduces the text byte for byte.
  """
  a, b = split_keepends(old), split_keepends(new)
  groups = difflib.SequenceMatcher(None, a, b).get_grouped_opcodes(context)
  return a, b, [(g[0][1], g[-1][2], g[0][3], g[-1][4]) for g in groups]


def split_keepends(text: str) -> list[str]:
  """`text` split after each "\\n"; "".join() of the result is `text`."""
  parts = text.split("\n")
  lines = [p + "\n" for p in parts[:-1]]
  return lines + [parts[-1]] if parts[-1] else lines
