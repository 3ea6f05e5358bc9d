"""Line edits: blocks that name the lines they replace by the numbers the prompt shows.

  <solution>
  ### path/to/file.py
  <<<<<<< LINES 12-13
  new lines
  >>>>>>> REPLACE
  </solution>

Nothing of the old text is copied (SWE-agent's `edit START:END`). The prompt numbers
every line it shows (`number_lines`), or counts only the shown lines
(`count_shown_lines`), the task recording each shown line's number in the file so
that answers' ranges map back (`file_ranges`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from rlcode.data.edits import common
from rlcode.data.edits import unified_diff


# A line as a line_edit prompt shows it ("12|..."), and the line that stands for a run of
# lines a prompt leaves out (`omitted_lines`).
NUMBERED_RE = re.compile(r"^\d+\|")


OMITTED_RE = re.compile(r"^\[\.\.\. lines (\d+)-(\d+) not shown \.\.\.\]$")


# The same, in a prompt whose numbers count the shown lines (`count_shown_lines`).
OMITTED_COUNT_RE = re.compile(r"^\[\.\.\. (\d+) lines not shown \.\.\.\]$")


# One line-edit block: "### path" (optional: an open file's), the range (A-B or A+N),
# whole replacement lines, the end.
_LINES_RE = re.compile(
    r"^(?:### (.*)\n)?<<<<<<< LINES (\d+)([-+])(\d+)\n((?:.*\n)*?)>>>>>>> REPLACE$", re.MULTILINE)


def omitted_lines(first: int, last: int) -> str:
  """The line a prompt shows in place of lines `first`..`last` (1-based) of a file."""
  return f"[... lines {first}-{last} not shown ...]\n"


def number_lines(text: str, first: int = 1) -> str:
  """`text` with each line prefixed by its number and "|" ("12|    return x"), as a
  line_edit prompt shows files; `first` is the number of the first line."""
  return "".join(f"{first + k}|{line}" for k, line in enumerate(common.split_keepends(text)))


def shift_line_numbers(prompt: str, reference: str, offset: int) -> tuple[str, str]:
  """A line_edit task as if every shown file had `offset` more lines on top: each shown
  line's number, each omitted range (the first one, from line 1, grows), the hunk headers
  of an applied diff, the reference's LINES ranges and its locating thought's numbers
  (locating_thought) all move down by `offset`; a file
  shown from its first line gains an omitted range of `offset` lines. The edit itself is
  the same. For warm starts (policy.warm_start's `warmstart.renumber`): a policy that
  copies its ranges from the numbered lines still fits; one that recalls likely numbers
  no longer does.
  """
  if offset < 0:
    raise ValueError(f"shift_line_numbers: offset must be >= 0, got {offset}")
  if offset == 0:
    return prompt, reference
  out, after_path = [], False
  for line in prompt.split("\n"):
    numbered = NUMBERED_RE.match(line)
    omitted = OMITTED_RE.match(line)
    hunk = unified_diff.HUNK_RE.match(line)
    if numbered:
      number = int(line[:numbered.end() - 1])
      if after_path and number == 1:
        out.append(omitted_lines(1, offset).rstrip("\n"))
      line = f"{number + offset}{line[numbered.end() - 1:]}"
    elif omitted:
      first, last = int(omitted.group(1)), int(omitted.group(2))
      line = omitted_lines(1 if first == 1 else first + offset, last + offset).rstrip("\n")
    elif hunk:
      old, old_n, new, new_n = hunk.groups()
      line = (f"@@ -{int(old) + offset}{'' if old_n is None else ',' + old_n} "
              f"+{int(new) + offset}{'' if new_n is None else ',' + new_n} @@"
              f"{line[hunk.end():]}")
    out.append(line)
    after_path = line.startswith("### ")

  def shift(m: re.Match) -> str:
    first, sign, other = int(m.group(1)), m.group(2), int(m.group(3))
    return f"LINES {first + offset}{sign}{other + offset if sign == '-' else other}"
  reference = re.sub(r"(?<=^<<<<<<< )LINES (\d+)([-+])(\d+)", shift, reference,
                     flags=re.MULTILINE)
  # A locating thought's numbers (locating_thought), in the thought only: a line of the
  # solution's new text that happens to read "at line 5." is code, not a number to move.
  thought, end, rest = reference.partition(common.THINK_END)
  if end:
    thought = re.sub(r"^at line (\d+)\.$", lambda m: f"at line {int(m.group(1)) + offset}.",
                     thought, flags=re.MULTILINE)
  return "\n".join(out), thought + end + rest


def count_shown_lines(text: str) -> tuple[str, list[int]]:
  """A numbered excerpt (`number_lines`, rlcode.data.git.excerpts.excerpt) renumbered to
  count the lines it shows: its k-th shown line is numbered k, and an omitted run says how
  many lines it hides, not which ("[... 17 lines not shown ...]"). Also returns the
  file's number of each shown line, in order: what `file_ranges` maps ranges back with.

  Raises:
    ValueError: a line that is neither numbered nor an omitted run.
  """
  out, numbers = [], []
  for line in common.split_keepends(text):
    numbered, omitted = NUMBERED_RE.match(line), OMITTED_RE.match(line.rstrip("\n"))
    if numbered:
      numbers.append(int(line[:numbered.end() - 1]))
      out.append(f"{len(numbers)}{line[numbered.end() - 1:]}")
    elif omitted:
      hidden = int(omitted.group(2)) - int(omitted.group(1)) + 1
      out.append(f"[... {hidden} lines not shown ...]" + line[len(line.rstrip("\n")):])
    else:
      raise ValueError(f"count_shown_lines: not a numbered excerpt's line: {line[:80]!r}")
  return "".join(out), numbers


def file_ranges(edits: Mapping[str, Sequence[tuple[int, int, str]]],
                shown_lines: Mapping[str, Sequence[int]]
                ) -> dict[str, list[tuple[int, int, str]]]:
  """Blocks whose ranges count the shown lines (`count_shown_lines`), as ranges of their
  files: shown line k is line shown_lines[path][k - 1] of its file; an insertion before
  shown line k goes before that line, one after the last shown line right after it. The
  blocks' order is kept (apply_line_edits checks it).

  Raises:
    FormatError ("bad_range"): a file the prompt does not show, a range outside the shown
      lines or reversed, a range across lines not shown.
  """
  out: dict[str, list[tuple[int, int, str]]] = {}
  for path, blocks in edits.items():
    if path not in shown_lines:
      raise common.FormatError("bad_range", f"{path}: not a file the prompt shows, so its lines "
                        "have no numbers")
    numbers = shown_lines[path]
    k = len(numbers)
    for first, last, text in blocks:
      if not 1 <= first <= last + 1 <= k + 1:
        raise common.FormatError("bad_range", f"{path}: LINES {first}-{last} is not a range of the "
                          f"{k} lines shown (A-B with 1 <= A <= B + 1 <= {k + 1})")
      if first > last:
        start = numbers[first - 1] if first <= k else (numbers[-1] + 1 if numbers else 1)
        out.setdefault(path, []).append((start, start - 1, text))
        continue
      start, stop = numbers[first - 1], numbers[last - 1]
      if stop - start != last - first:
        raise common.FormatError("bad_range", f"{path}: LINES {first}-{last} runs across lines "
                          "that are not shown")
      out.setdefault(path, []).append((start, stop, text))
  return out


def shown_ranges(solution: str, shown_lines: Mapping[str, Sequence[int]],
                 open_file: str = "") -> str:
  """`solution`'s LINES ranges (numbers of the files) rewritten to count the shown lines:
  the inverse of `file_ranges`, for a reference whose prompt counts them. A+N keeps its
  length, A-B its span.

  Raises:
    ValueError: a block whose lines (or, for an insertion, the line it goes before, or
      the end of the last shown line) are not shown.
  """
  def rewrite(m: re.Match) -> str:
    path = m.group(1) or open_file
    numbers = list(shown_lines.get(path, ()))
    first, sign, other = int(m.group(2)), m.group(3), int(m.group(4))
    last = other if sign == "-" else first + other - 1
    span = max(last - first, 0)
    if first in numbers and numbers[numbers.index(first):][span:span + 1] == [first + span]:
      local = numbers.index(first) + 1
    elif last == first - 1 and first == (numbers[-1] + 1 if numbers else 1):
      local = len(numbers) + 1
    else:
      raise ValueError(f"shown_ranges: {path}: LINES {first}{sign}{other} is not within the "
                       "shown lines")
    head = m.group(0)[:m.start(2) - m.start(0)]
    tail = m.group(0)[m.end(4) - m.start(0):]
    return f"{head}{local}{sign}{local + last - first if sign == '-' else other}{tail}"
  return _LINES_RE.sub(rewrite, solution)


def parse_line_edits(solution: str, open_file: str = ""
                     ) -> dict[str, list[tuple[int, int, str]]]:
  """path -> [(first, last, new text), ...] in the order the blocks appear.

  LINES A-B replaces lines A..B (1-based, inclusive) of the file as it was
  before any block of the answer; B = A - 1 is an empty range (insert before
  line A). LINES A+N is the same range by its length: the N lines from line A
  (A+0 inserts before line A), as a unified diff's hunk header counts. The new
  text is the block's whole lines, each with its newline ("" deletes the
  range). Lines outside blocks (fences, prose) are ignored.
  A block's "### path" line names its file; `open_file` is the file of a block
  without one (the one file a prompt shows, as an editor's open file).

  Raises:
    FormatError: a block without a path when there is no open file ("no_path").
  """
  edits: dict[str, list[tuple[int, int, str]]] = {}
  for path, first, sign, other, text in _LINES_RE.findall(solution):
    path = path or open_file
    if not path:
      raise common.FormatError("no_path", f"LINES {first}{sign}{other} has no '### path' line before "
                        "it, and the prompt shows more than one file")
    last = int(other) if sign == "-" else int(first) + int(other) - 1
    edits.setdefault(path, []).append((int(first), last, text))
  return edits


def apply_line_edits(files: Mapping[str, str],
                     edits: Mapping[str, Sequence[tuple[int, int, str]]]
                     ) -> dict[str, str]:
  """New contents of every edited file (a path absent from `files` is empty).

  Raises:
    FormatError: a range outside the file or reversed ("bad_range"), ranges of
      one file out of order or overlapping ("bad_range"), a block whose new
      text equals the lines it replaces ("unchanged").
  """
  out = {}
  for path, blocks in edits.items():
    content = files.get(path, "")
    lines = common.split_keepends(content)
    previous_last = 0
    for first, last, text in blocks:
      if not (1 <= first <= last + 1 <= len(lines) + 1):
        raise common.FormatError("bad_range", f"{path}: LINES {first}-{last} is not a range of its "
                          f"{len(lines)} lines (A-B with 1 <= A <= B + 1 <= lines + 1)")
      if first <= previous_last:
        raise common.FormatError("bad_range", f"{path}: LINES {first}-{last} overlaps or precedes "
                          "the block before it (blocks go down the file, apart)")
      previous_last = last
    # Bottom up, so that every block's numbers stay those of the original file.
    for first, last, text in reversed(blocks):
      if last == len(lines) and last and not lines[-1].endswith("\n"):
        text = text[:-1] if text.endswith("\n") else text
      if text == "".join(lines[first - 1:last]):
        raise common.FormatError("unchanged", f"{path}: LINES {first}-{last} are replaced by "
                          "the same text")
      lines[first - 1:last] = [text] if text else []
    out[path] = "".join(lines)
  return out


def locating_thought(files: Mapping[str, str], solution: str, open_file: str = "") -> str:
  """A reference's reasoning that finds each LINES block of `solution` before writing it:
  per block, the first line it replaces quoted as the prompt shows it (for an insertion,
  the line it goes before), then its number ("Replace" / the line / "at line 23.").
  Quoting a line is copying text the request points at (the identifier to rename, the
  constant to change); its number then stands right before that text in the prompt, and
  the block's range repeats the number just written. `files` are the contents the
  ranges count in; a named block's thought starts with its path.
  """
  steps = []
  for path, blocks in parse_line_edits(solution, open_file).items():
    lines = common.split_keepends(files.get(path, ""))
    for first, last, _ in blocks:
      where = "" if path == open_file else f"In {path}: "
      if first <= last:
        steps.append(f"{where}Replace\n{lines[first - 1].rstrip(chr(10))}\nat line {first}.")
      elif first <= len(lines):
        steps.append(f"{where}Insert before\n{lines[first - 1].rstrip(chr(10))}\n"
                     f"at line {first}.")
      else:
        steps.append(f"{where}Insert after the last line\nat line {first}.")
  return "\n".join(steps)


def line_blocks(path: str, old: str, new: str, context: int, named: bool = True,
                 counted: bool = False) -> list[str]:
  """LINES blocks taking `old` to `new`: one per hunk of `context` unchanged lines
  around its change (numbers of `old`; a pure insertion is an empty range);
  named=False leaves out the "### path" line (the open file's blocks); counted=True
  writes each range as its first line and length (A+N) instead of A-B."""
  a, b, groups = common.line_hunks(old, new, context)
  head = f"### {path}\n" if named else ""
  return [f"{head}<<<<<<< LINES {i1 + 1}{f'+{i2 - i1}' if counted else f'-{i2}'}\n"
          + "".join(line if line.endswith("\n") else line + "\n" for line in b[j1:j2])
          + ">>>>>>> REPLACE" for i1, i2, j1, j2 in groups]
