"""Edit formats of diff tasks: the prompt, parsing a completion, applying it.

A diff task shows the policy a change request and some files; the policy
answers with a reasoning block and a solution block (SWE-RL's format):

  <think>
  ...
  </think>
  <solution>
  ```python
  ### path/to/file.py
  <<<<<<< SEARCH
  old lines
  =======
  new lines
  >>>>>>> REPLACE
  ```
  </solution>

or, with `edit_format="unified_diff"`, a unified diff inside the solution block,
or, with `edit_format="line_edit"`, blocks that address the lines to replace by
their numbers, which the prompt shows (SWE-agent's `edit START:END` command;
nothing of the old text is copied):

  <solution>
  ### path/to/file.py
  <<<<<<< LINES 12-13
  new lines
  >>>>>>> REPLACE
  </solution>

This module turns a completion into new file contents (`apply_completion`),
raising `FormatError` for anything that cannot apply; renders an oracle answer
in any of the formats (`oracle_completion`, used as a task's reference and to prove
every mined oracle is expressible); and writes the prompt (`build_prompt`).
`normalized_patch` is the per-file diff text the SWE-RL reward compares; it is
here because the miner must use the very same definition to reject changes the
reward cannot see. This module must not score (rlcode.rewards.diffs does) nor
know where tasks come from (rlcode.data.git).

Search/replace semantics follow facebookresearch/swe-rl (src/swerl/core/
reward.py) exactly: exactly one of each tag, a non-empty thought, blocks matched
by the same pattern, a path absent from the files is an empty (new) file, each
SEARCH must occur at a line start ("\\n" + search in "\\n" + content), and every
occurrence is replaced.
"""

from __future__ import annotations

import dataclasses
import difflib
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence

EDIT_FORMATS = ("search_replace", "unified_diff", "line_edit")

THINK_START, THINK_END = "<think>", "</think>"
SOLUTION_START, SOLUTION_END = "<solution>", "</solution>"

# One SEARCH/REPLACE block; the same language as SWE-RL's SEARCH_REPLACE_REGEX:
# a fence line, "### path", then lazily matched search and replace texts.
_BLOCK_RE = re.compile(
    r"```.*?\n### (.*)\n<<<<<<< SEARCH\n([\s\S]*?)\n=======\n([\s\S]*?)"
    r"\n>>>>>>> REPLACE\n```")
# A fence whose closing line is exactly ``` (diff lines always carry a prefix).
_FENCE_RE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
# A line as a line_edit prompt shows it ("12|..."), and the line that stands for a run of
# lines a prompt leaves out (`omitted_lines`).
_NUMBERED_RE = re.compile(r"^\d+\|")
_OMITTED_RE = re.compile(r"^\[\.\.\. lines (\d+)-(\d+) not shown \.\.\.\]$")
# The same, in a prompt whose numbers count the shown lines (`count_shown_lines`).
_OMITTED_COUNT_RE = re.compile(r"^\[\.\.\. (\d+) lines not shown \.\.\.\]$")
# One line-edit block: "### path" (optional: an open file's), the range (A-B or A+N),
# whole replacement lines, the end.
_LINES_RE = re.compile(
    r"^(?:### (.*)\n)?<<<<<<< LINES (\d+)([-+])(\d+)\n((?:.*\n)*?)>>>>>>> REPLACE$", re.MULTILINE)

_LANGUAGE_TAGS = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".tsx": "typescript", ".go": "go", ".rs": "rust",
    ".java": "java", ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp",
    ".hpp": "cpp", ".rb": "ruby", ".sh": "bash", ".md": "markdown",
}


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


# ---------------------------------------------------------------------------
# The reward's view of a change.

def normalized_patch(old: str, new: str) -> str:
  """SWE-RL's per-file diff text: unified, 3 context lines, headers removed.

  Lines are split with `str.splitlines`, as SWE-RL does, so a change that only
  touches line terminators (a final newline, CR/LF) is invisible: "".
  """
  lines = difflib.unified_diff(old.splitlines(), new.splitlines(),
                               fromfile="old", tofile="new", lineterm="", n=3)
  return "\n".join(list(lines)[2:])


# ---------------------------------------------------------------------------
# Completion -> solution text.

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


# ---------------------------------------------------------------------------
# SEARCH/REPLACE.

def parse_search_replace(solution: str) -> dict[str, list[tuple[str, str]]]:
  """path -> [(search, replace), ...] in the order the blocks appear."""
  edits: dict[str, list[tuple[str, str]]] = {}
  for path, search, replace in _BLOCK_RE.findall(solution):
    edits.setdefault(path, []).append((search, replace))
  return edits


def apply_search_replace(files: Mapping[str, str],
                         edits: Mapping[str, Sequence[tuple[str, str]]]
                         ) -> dict[str, str]:
  """New contents of every edited file.

  Raises:
    FormatError: a block's SEARCH equals its REPLACE, or SEARCH does not occur
      at a line start of the file as edited by the blocks before it.
  """
  out = {}
  for path, pairs in edits.items():
    # The leading newline anchors every search at a line start.
    content = "\n" + files.get(path, "")
    for search, replace in pairs:
      if search == replace:
        raise FormatError("search_equals_replace",
                          f"{path}: a SEARCH block equals its REPLACE block")
      if "\n" + search not in content:
        raise FormatError("search_not_found",
                          f"{path}: SEARCH text not found: {search[:200]!r}")
      content = content.replace("\n" + search, "\n" + replace)
    out[path] = content[1:]
  return out


# ---------------------------------------------------------------------------
# Unified diff.

@dataclasses.dataclass
class _Hunk:
  old_start: int
  body: list[tuple[str, str]]  # (op in " -+", line text without terminator)
  new_missing_eol: bool        # "\ No newline at end of file" on the new side


def _split_lines(text: str) -> tuple[list[str], bool]:
  """Lines without terminators, and whether the text ends with a newline."""
  if not text:
    return [], True
  lines = text.split("\n")
  if lines[-1] == "":
    return lines[:-1], True
  return lines, False


def _join_lines(lines: list[str], eol: bool) -> str:
  return "\n".join(lines) + ("\n" if eol and lines else "")


def _diff_text(solution: str) -> str:
  # Each fence's text ends with the newline before its closing ```.
  fenced = [f[:-1] if f.endswith("\n") else f
            for f in _FENCE_RE.findall(solution)]
  return "\n".join(fenced) if fenced else solution


def _header_path(line: str, prefix: str) -> str:
  path = line[4:].split("\t")[0].rstrip("\r")
  if path != "/dev/null" and path.startswith(prefix):
    path = path[len(prefix):]
  return path


def parse_unified_diff(solution: str) -> list[tuple[str, list[_Hunk]]]:
  """[(path, hunks), ...] of the unified diff in a solution.

  The diff is the text of the solution's ``` fences when it has any, else the
  whole solution. Lines outside file sections ("diff --git", "index", prose)
  are ignored; hunk bodies must have exactly the line counts their headers
  give, as `git apply` requires. An empty line inside a hunk is read as an
  empty context line.

  Raises:
    FormatError: a malformed or truncated hunk, a hunk outside a file section,
      or a file deletion (tasks never delete files).
  """
  lines = _diff_text(solution).split("\n")
  files: list[tuple[str, list[_Hunk]]] = []
  i = 0
  while i < len(lines):
    line = lines[i]
    if (line.startswith("--- ") and i + 1 < len(lines)
        and lines[i + 1].startswith("+++ ")):
      path = _header_path(lines[i + 1], "b/")
      if path == "/dev/null":
        raise FormatError("deletion", f"{_header_path(line, 'a/')}: the diff "
                          "deletes a file; tasks only edit or create files")
      files.append((path, []))
      i += 2
      continue
    m = _HUNK_RE.match(line)
    if m is None:
      if files and files[-1][1] and line[:1] in ("+", "-"):
        raise FormatError("bad_hunk", f"line {i + 1} is outside any hunk "
                          f"(hunk header counts too small?): {line[:80]!r}")
      i += 1
      continue
    if not files:
      raise FormatError("bad_hunk", f"hunk at line {i + 1} has no ---/+++ "
                        "file header before it")
    old_n = int(m.group(2)) if m.group(2) is not None else 1
    new_n = int(m.group(4)) if m.group(4) is not None else 1
    hunk = _Hunk(int(m.group(1)), [], False)
    seen_old = seen_new = 0
    i += 1
    while seen_old < old_n or seen_new < new_n:
      if i >= len(lines):
        raise FormatError("bad_hunk", f"{files[-1][0]}: hunk ends after "
                          f"{seen_old}/{old_n} old and {seen_new}/{new_n} new "
                          "lines")
      body_line = lines[i]
      op, text = (body_line[:1] or " "), body_line[1:]
      if op == "\\":
        if hunk.body and hunk.body[-1][0] in " +":
          hunk.new_missing_eol = True
        i += 1
        continue
      if op not in " -+":
        raise FormatError("bad_hunk", f"{files[-1][0]}: line {i + 1} inside a "
                          f"hunk starts with {op!r}: {body_line[:80]!r}")
      seen_old += op in " -"
      seen_new += op in " +"
      if seen_old > old_n or seen_new > new_n:
        raise FormatError("bad_hunk", f"{files[-1][0]}: the hunk "
                          f"{m.group(0)!r} has more lines than it says")
      hunk.body.append((op, text))
      i += 1
    if i < len(lines) and lines[i].startswith("\\"):
      if hunk.body and hunk.body[-1][0] in " +":
        hunk.new_missing_eol = True
      i += 1
    files[-1][1].append(hunk)
  return [(path, hunks) for path, hunks in files if hunks]


def _find_block(lines: list[str], block: list[str], expected: int,
                lowest: int) -> int:
  """The start nearest to `expected`, at or after `lowest`, where `block` is."""
  last = len(lines) - len(block)
  for distance in range(max(expected - lowest, last - expected, 0) + 1):
    for start in (expected - distance, expected + distance):
      if lowest <= start <= last and lines[start:start + len(block)] == block:
        return start
  return -1


def apply_unified_diff(files: Mapping[str, str],
                       patches: Sequence[tuple[str, list[_Hunk]]]
                       ) -> dict[str, str]:
  """New contents of every file the diff touches.

  Hunks apply in order; each one's old lines must match the file exactly,
  searched from its stated line outwards (line offsets are tolerated, no fuzz).
  "\\ No newline" on the new side of a hunk that reaches the end of the file
  removes the final newline; the old side's marker is not checked, because the
  reward (`normalized_patch`) cannot see final newlines anyway.

  Raises:
    FormatError: a hunk whose old lines are not in the file.
  """
  out: dict[str, str] = {}
  for path, hunks in patches:
    lines, eol = _split_lines(out.get(path, files.get(path, "")))
    lowest = delta = 0
    for hunk in hunks:
      old = [t for op, t in hunk.body if op in " -"]
      new = [t for op, t in hunk.body if op in " +"]
      # A hunk that removes no line names the line it inserts after.
      expected = hunk.old_start - (1 if old else 0) + delta
      if old:
        start = _find_block(lines, old, expected, lowest)
      else:
        start = expected if lowest <= expected <= len(lines) else -1
      if start < 0:
        raise FormatError("hunk_does_not_apply", f"{path}: the hunk at old "
                          f"line {hunk.old_start} does not match the file")
      if start + len(old) == len(lines):
        eol = not hunk.new_missing_eol
      lines[start:start + len(old)] = new
      lowest = start + len(new)
      delta += len(new) - len(old)
    out[path] = _join_lines(lines, eol)
  return out


# ---------------------------------------------------------------------------
# Line edits.

def omitted_lines(first: int, last: int) -> str:
  """The line a prompt shows in place of lines `first`..`last` (1-based) of a file."""
  return f"[... lines {first}-{last} not shown ...]\n"


def number_lines(text: str, first: int = 1) -> str:
  """`text` with each line prefixed by its number and "|" ("12|    return x"), as a
  line_edit prompt shows files; `first` is the number of the first line."""
  return "".join(f"{first + k}|{line}" for k, line in enumerate(split_keepends(text)))


def shift_line_numbers(prompt: str, reference: str, offset: int) -> tuple[str, str]:
  """A line_edit task as if every shown file had `offset` more lines on top: each shown
  line's number, each omitted range (the first one, from line 1, grows), the hunk headers
  of an applied diff, the reference's LINES ranges and its locating thought's numbers
  (locating_thought) all move down by `offset`; a file
  shown from its first line gains an omitted range of `offset` lines. The edit itself is
  the same. For warm starts (train.warm_start's `warmstart.renumber`): a policy that
  copies its ranges from the numbered lines still fits; one that recalls likely numbers
  no longer does.
  """
  if offset < 0:
    raise ValueError(f"shift_line_numbers: offset must be >= 0, got {offset}")
  if offset == 0:
    return prompt, reference
  out, after_path = [], False
  for line in prompt.split("\n"):
    numbered = _NUMBERED_RE.match(line)
    omitted = _OMITTED_RE.match(line)
    hunk = _HUNK_RE.match(line)
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
  thought, end, rest = reference.partition(THINK_END)
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
  for line in split_keepends(text):
    numbered, omitted = _NUMBERED_RE.match(line), _OMITTED_RE.match(line.rstrip("\n"))
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
      raise FormatError("bad_range", f"{path}: not a file the prompt shows, so its lines "
                        "have no numbers")
    numbers = shown_lines[path]
    k = len(numbers)
    for first, last, text in blocks:
      if not 1 <= first <= last + 1 <= k + 1:
        raise FormatError("bad_range", f"{path}: LINES {first}-{last} is not a range of the "
                          f"{k} lines shown (A-B with 1 <= A <= B + 1 <= {k + 1})")
      if first > last:
        start = numbers[first - 1] if first <= k else (numbers[-1] + 1 if numbers else 1)
        out.setdefault(path, []).append((start, start - 1, text))
        continue
      start, stop = numbers[first - 1], numbers[last - 1]
      if stop - start != last - first:
        raise FormatError("bad_range", f"{path}: LINES {first}-{last} runs across lines "
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
      raise FormatError("no_path", f"LINES {first}{sign}{other} has no '### path' line before "
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
    lines = split_keepends(content)
    previous_last = 0
    for first, last, text in blocks:
      if not (1 <= first <= last + 1 <= len(lines) + 1):
        raise FormatError("bad_range", f"{path}: LINES {first}-{last} is not a range of its "
                          f"{len(lines)} lines (A-B with 1 <= A <= B + 1 <= lines + 1)")
      if first <= previous_last:
        raise FormatError("bad_range", f"{path}: LINES {first}-{last} overlaps or precedes "
                          "the block before it (blocks go down the file, apart)")
      previous_last = last
    # Bottom up, so that every block's numbers stay those of the original file.
    for first, last, text in reversed(blocks):
      if last == len(lines) and last and not lines[-1].endswith("\n"):
        text = text[:-1] if text.endswith("\n") else text
      if text == "".join(lines[first - 1:last]):
        raise FormatError("unchanged", f"{path}: LINES {first}-{last} are replaced by "
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
    lines = split_keepends(files.get(path, ""))
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


# ---------------------------------------------------------------------------
# Completion -> new contents.

def apply_completion(completion: str, files: Mapping[str, str],
                     edit_format: str = "search_replace", open_file: str = "",
                     shown_lines: Mapping[str, Sequence[int]] | None = None
                     ) -> dict[str, str]:
  """path -> new content for every file the completion edits.

  `open_file`: line_edit only, the file of a block that names none (the task's
  `extra["open_file"]`: the one file its prompt shows; parse_line_edits).
  `shown_lines`: line_edit only, for a prompt whose numbers count the lines it shows
  (the task's `extra["shown_lines"]`, `count_shown_lines`): each shown file's numbers of
  its shown lines, which the ranges are mapped through (`file_ranges`); None: ranges
  are the files' own numbers.

  Raises:
    FormatError: anything that keeps the completion from applying.
    ValueError: an unknown edit format.
  """
  if edit_format not in EDIT_FORMATS:
    raise ValueError(f"edit_format={edit_format!r}; expected one of "
                     f"{EDIT_FORMATS}")
  _, solution = extract_thought_solution(completion)
  if edit_format == "search_replace":
    edits = parse_search_replace(solution)
    if not edits:
      raise FormatError("no_edits", "no SEARCH/REPLACE block in the solution")
    return apply_search_replace(files, edits)
  if edit_format == "line_edit":
    blocks = parse_line_edits(solution, open_file)
    if not blocks:
      raise FormatError("no_edits", "no LINES block in the solution")
    if shown_lines is not None:
      blocks = file_ranges(blocks, shown_lines)
    return apply_line_edits(files, blocks)
  patches = parse_unified_diff(solution)
  if not patches:
    raise FormatError("no_edits", "no unified diff hunk in the solution")
  return apply_unified_diff(files, patches)


# ---------------------------------------------------------------------------
# Oracle answers.

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


def _render_block(path: str, search: str, replace: str) -> str:
  tag = _LANGUAGE_TAGS.get(posixpath.splitext(path)[1], "")
  return (f"```{tag}\n### {path}\n<<<<<<< SEARCH\n{search}\n=======\n"
          f"{replace}\n>>>>>>> REPLACE\n```")


def _search_replace_pairs(before: list[str], after: list[str]
                          ) -> list[tuple[str, str]]:
  """(search, replace) texts for replacing lines `before` by `after`.

  The block syntax puts a newline after each text, so a final newline both
  sides share can be left out; keeping it makes the search more specific (it
  then must end a line), which the caller may need for uniqueness.
  """
  s, r = "".join(before), "".join(after)
  if s.endswith("\n") and r.endswith("\n"):
    return [(s[:-1], r[:-1]), (s, r)]
  return [(s, r)]


def _unique_at_line_start(content: str, search: str) -> bool:
  haystack, needle = "\n" + content, "\n" + search
  first = haystack.find(needle)
  return first >= 0 and haystack.find(needle, first + 1) < 0


def _file_blocks(path: str, old: str, new: str, context: int) -> list[str]:
  """SEARCH/REPLACE blocks taking `old` to `new`, each unique when applied.

  Each block starts as a hunk with `context` unchanged lines around its change
  and grows a line on each side until its SEARCH text occurs once (an empty
  SEARCH, a pure insertion with no context, never does in a non-empty file).
  """
  a, b, groups = line_hunks(old, new, context)
  current = list(a)
  blocks = []
  shift = 0
  for i1, i2, j1, j2 in groups:
    lo, hi = i1 + shift, i2 + shift
    new_lines = b[j1:j2]
    text = "".join(current)
    while True:
      pairs = _search_replace_pairs(current[lo:hi],
                                    current[lo:i1 + shift] + new_lines
                                    + current[i2 + shift:hi])
      unique = [p for p in pairs if _unique_at_line_start(text, p[0])]
      if unique or (lo == 0 and hi == len(current)):
        s, r = (unique or pairs)[0]
        break
      lo, hi = max(lo - 1, 0), min(hi + 1, len(current))
    blocks.append(_render_block(path, s, r))
    current[i1 + shift:i2 + shift] = new_lines
    shift += (j2 - j1) - (i2 - i1)
  return blocks


def _line_blocks(path: str, old: str, new: str, context: int, named: bool = True,
                 counted: bool = False) -> list[str]:
  """LINES blocks taking `old` to `new`: one per hunk of `context` unchanged lines
  around its change (numbers of `old`; a pure insertion is an empty range);
  named=False leaves out the "### path" line (the open file's blocks); counted=True
  writes each range as its first line and length (A+N) instead of A-B."""
  a, b, groups = line_hunks(old, new, context)
  head = f"### {path}\n" if named else ""
  return [f"{head}<<<<<<< LINES {i1 + 1}{f'+{i2 - i1}' if counted else f'-{i2}'}\n"
          + "".join(line if line.endswith("\n") else line + "\n" for line in b[j1:j2])
          + ">>>>>>> REPLACE" for i1, i2, j1, j2 in groups]


def _render_unified_diff(path: str, old: str, new: str) -> str:
  a, b, groups = line_hunks(old, new)
  # As git writes it for a new file; an existing empty file reads the same.
  out = [f"--- a/{path}" if old else "--- /dev/null", f"+++ b/{path}"]

  def emit(prefix, line):
    out.append(prefix + line.rstrip("\n") if line.endswith("\n")
               else prefix + line)
    if not line.endswith("\n"):
      out.append("\\ No newline at end of file")

  for i1, i2, j1, j2 in groups:
    out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@")
    for tag, k1, k2, l1, l2 in difflib.SequenceMatcher(
        None, a[i1:i2], b[j1:j2]).get_opcodes():
      if tag == "equal":
        for line in a[i1 + k1:i1 + k2]:
          emit(" ", line)
        continue
      for line in a[i1 + k1:i1 + k2]:
        emit("-", line)
      for line in b[j1 + l1:j1 + l2]:
        emit("+", line)
  return "\n".join(out)


def _range(start: int, stop: int) -> str:
  n = stop - start
  return f"{start + 1 if n else start},{n}"


def oracle_completion(files: Mapping[str, str], oracle: Mapping[str, str],
                      edit_format: str = "search_replace",
                      thought: str = "The change follows the request.",
                      context_lines: int = 3, open_file: str = "",
                      line_counts: bool = False) -> str:
  """A completion in `edit_format` that takes `files` to `oracle` exactly.

  `context_lines`: the unchanged lines each SEARCH/REPLACE or LINES block
  starts with around its change (3, as a unified diff's hunks; 0, the changed
  lines only; a SEARCH text is widened just enough to be unique). A unified
  diff always has 3. `open_file` (line_edit only): that file's blocks leave
  out their "### path" line (apply_completion's open_file). `line_counts`
  (line_edit only): ranges as A+N (first line and length) rather than A-B.

  Raises:
    ValueError: the format cannot express the change (for example a SEARCH
      text containing a line "=======" cuts the block short); the message
      names the file.
  """
  if edit_format not in EDIT_FORMATS:
    raise ValueError(f"edit_format={edit_format!r}; expected one of "
                     f"{EDIT_FORMATS}")
  parts = []
  for path in sorted(oracle):
    old, new = files.get(path, ""), oracle[path]
    if old == new:
      continue
    if edit_format == "search_replace":
      parts.extend(_file_blocks(path, old, new, context_lines))
    elif edit_format == "line_edit":
      parts.extend(_line_blocks(path, old, new, context_lines, named=path != open_file,
                                counted=line_counts))
    else:
      parts.append("```diff\n" + _render_unified_diff(path, old, new) + "\n```")
  completion = (f"{THINK_START}\n{thought}\n{THINK_END}\n{SOLUTION_START}\n"
                + "\n\n".join(parts) + f"\n{SOLUTION_END}")
  try:
    applied = apply_completion(completion, files, edit_format, open_file)
  except FormatError as e:
    raise ValueError(f"the oracle cannot be written as {edit_format}: {e}") from e
  for path in sorted(set(applied) | set(oracle)):
    want = oracle.get(path, files.get(path, ""))
    if applied.get(path, files.get(path, "")) != want:
      raise ValueError(f"the oracle cannot be written as {edit_format}: "
                       f"{path} comes out different")
  return completion


# ---------------------------------------------------------------------------
# The prompt.

_THINKING = f"""\
Answer in two parts. First think the problem through inside {THINK_START} \
{THINK_END}: as long and as informal as you need. Then give the final answer \
inside {SOLUTION_START} {SOLUTION_END}:
{THINK_START}
your reasoning
{THINK_END}
{SOLUTION_START}
your edits
{SOLUTION_END}"""

_SEARCH_REPLACE_HOWTO = """\
Write the change as *SEARCH/REPLACE* edits. Each edit is one fenced code block \
holding, in this order:
1. a line "### " followed by the file path
2. the line <<<<<<< SEARCH
3. a contiguous run of whole lines copied exactly from the current file
4. the line =======
5. the lines that replace them
6. the line >>>>>>> REPLACE

For example, to make `total` round its result:

```python
### shop/cart.py
<<<<<<< SEARCH
def total(prices):
    return sum(prices)
=======
def total(prices):
    return round(sum(prices), 2)
>>>>>>> REPLACE
```

Indentation matters: copy the search lines with every leading space. To create \
a new file, leave the SEARCH part empty. Use one fenced block per edit."""

_UNIFIED_DIFF_HOWTO = """\
Write the change as a unified diff (the output of `git diff`), inside a \
```diff fenced block: for each file a "--- a/PATH" and a "+++ b/PATH" line, \
then hunks "@@ -OLD_START,OLD_COUNT +NEW_START,NEW_COUNT @@" whose lines start \
with " " (unchanged), "-" (removed) or "+" (added). The counts must match the \
hunk's lines. For example, to make `total` round its result:

```diff
--- a/shop/cart.py
+++ b/shop/cart.py
@@ -1,2 +1,2 @@
 def total(prices):
-    return sum(prices)
+    return round(sum(prices), 2)
```

To create a new file, use "--- /dev/null" and a hunk "@@ -0,0 +1,N @@"."""


_LINE_EDIT_HOWTO = """\
Write the change as *LINES* edits. The files above show each line's number \
before a "|". Each edit holds, in this order:
1. a line "### " followed by the file path
2. the line <<<<<<< LINES A-B, to replace lines A to B (A-B with B = A - 1 \
inserts before line A), or <<<<<<< LINES A+N, to replace the N lines from line A
3. the lines that replace them, without numbers (none deletes the lines)
4. the line >>>>>>> REPLACE

For example, to make `total` round its result when the file shows \
"2|    return sum(prices)":

### shop/cart.py
<<<<<<< LINES 2-2
    return round(sum(prices), 2)
>>>>>>> REPLACE

Numbers are those of the files as shown; give the edits of a file top to \
bottom, without overlaps."""


_BRIEF = {
    "search_replace": "Make the requested change: reasoning inside <think> </think>, then "
                      "*SEARCH/REPLACE* edits inside <solution> </solution>.",
    "unified_diff": "Make the requested change: reasoning inside <think> </think>, then a "
                    "unified diff inside <solution> </solution>.",
    "line_edit": "Make the requested change: reasoning inside <think> </think>, then "
                 "*LINES* edits inside <solution> </solution>.",
}
_HOWTO = {"search_replace": _SEARCH_REPLACE_HOWTO, "unified_diff": _UNIFIED_DIFF_HOWTO,
          "line_edit": _LINE_EDIT_HOWTO}


def build_prompt(request: str, files: Mapping[str, str],
                 edit_format: str = "search_replace",
                 new_files: Iterable[str] = (),
                 applied_diff: str = "",
                 instructions: bool = True,
                 open_file: bool = False) -> str:
  """The prompt of a diff task.

  Args:
    request: what to change (a commit message).
    files: path -> current content as shown, in sorted path order. For
      "line_edit" each shown line carries its number (`number_lines`, or the
      numbered excerpts of rlcode.data.git.excerpts); only an `omitted_lines`
      marker may go without.
    edit_format: one of EDIT_FORMATS; names the answer format.
    new_files: paths of `files` that do not exist yet (content "").
    applied_diff: for a task that is part of a larger change, the rest of the
      change as a unified diff; the files already include it.
    instructions: explain the answer format with an example (True), or name it
      in one closing line (False: about 400 fewer tokens, for a policy that
      learns the format from a warm start).
    open_file: line_edit with one file shown: its edits may leave out the "### path"
      line (apply_completion's open_file); the instructions say so.
  """
  if edit_format not in EDIT_FORMATS:
    raise ValueError(f"edit_format={edit_format!r}; expected one of "
                     f"{EDIT_FORMATS}")
  new_files = set(new_files)
  if edit_format == "line_edit":
    for path in sorted(set(files) - new_files):
      bare = [line.rstrip("\n") for line in split_keepends(files[path])
              if not _NUMBERED_RE.match(line)
              and not _OMITTED_RE.match(line.rstrip("\n"))
              and not _OMITTED_COUNT_RE.match(line.rstrip("\n"))]
      if bare:
        raise ValueError(f"{path}: a line_edit prompt numbers every line it shows "
                         f"(number_lines); this one is not numbered: {bare[0][:80]!r}")
  parts = [_THINKING, ""] if instructions else []
  parts += ["Here is a change request for a repository:",
           "--- BEGIN REQUEST ---", request.strip(), "--- END REQUEST ---", ""]
  if applied_diff:
    parts += ["Part of this change has already been made (the files below "
              "include it); write only the rest. The part already made:",
              "--- BEGIN APPLIED CHANGES ---", applied_diff.rstrip("\n"),
              "--- END APPLIED CHANGES ---", ""]
  parts.append("The relevant files, as they are now:")
  for path in sorted(files):
    parts.append("--- BEGIN FILE ---")
    parts.append(f"### {path}")
    if path in new_files:
      parts.append("(this file does not exist yet)")
    else:
      parts.append(files[path].rstrip("\n"))
    parts.append("--- END FILE ---")
  if not instructions:
    return "\n".join(parts + ["", _BRIEF[edit_format]])
  howto = _HOWTO[edit_format]
  if open_file:
    if edit_format != "line_edit" or len(files) != 1:
      raise ValueError("open_file: only a line_edit prompt that shows one file has an open "
                       f"file (edit_format={edit_format!r}, {len(files)} files)")
    howto += ("\n\nOne file is shown, so its edits may leave out the \"### \" line.")
  parts += ["", "Make the requested change. " + howto]
  return "\n".join(parts)


def unified_diff_text(before: Mapping[str, str], after: Mapping[str, str]) -> str:
  """A git-style unified diff of every path whose content differs."""
  out = []
  for path in sorted(after):
    old, new = before.get(path, ""), after[path]
    if old != new:
      out.append(_render_unified_diff(path, old, new))
  return "\n".join(out)
