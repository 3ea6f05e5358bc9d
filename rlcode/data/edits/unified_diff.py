"""Unified diffs as answers: parsing, applying hunk by hunk, rendering.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from rlcode.data.edits import common


# A fence whose closing line is exactly ``` (diff lines always carry a prefix).
_FENCE_RE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


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
        raise common.FormatError("deletion", f"{_header_path(line, 'a/')}: the diff "
                          "deletes a file; tasks only edit or create files")
      files.append((path, []))
      i += 2
      continue
    m = HUNK_RE.match(line)
    if m is None:
      if files and files[-1][1] and line[:1] in ("+", "-"):
        raise common.FormatError("bad_hunk", f"line {i + 1} is outside any hunk "
                          f"(hunk header counts too small?): {line[:80]!r}")
      i += 1
      continue
    if not files:
      raise common.FormatError("bad_hunk", f"hunk at line {i + 1} has no ---/+++ "
                        "file header before it")
    old_n = int(m.group(2)) if m.group(2) is not None else 1
    new_n = int(m.group(4)) if m.group(4) is not None else 1
    hunk = _Hunk(int(m.group(1)), [], False)
    seen_old = seen_new = 0
    i += 1
    while seen_old < old_n or seen_new < new_n:
      if i >= len(lines):
        raise common.FormatError("bad_hunk", f"{files[-1][0]}: hunk ends after "
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
        raise common.FormatError("bad_hunk", f"{files[-1][0]}: line {i + 1} inside a "
                          f"hunk starts with {op!r}: {body_line[:80]!r}")
      seen_old += op in " -"
      seen_new += op in " +"
      if seen_old > old_n or seen_new > new_n:
        raise common.FormatError("bad_hunk", f"{files[-1][0]}: the hunk "
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
        raise common.FormatError("hunk_does_not_apply", f"{path}: the hunk at old "
                          f"line {hunk.old_start} does not match the file")
      if start + len(old) == len(lines):
        eol = not hunk.new_missing_eol
      lines[start:start + len(old)] = new
      lowest = start + len(new)
      delta += len(new) - len(old)
    out[path] = _join_lines(lines, eol)
  return out


def render_unified_diff(path: str, old: str, new: str) -> str:
  a, b, groups = common.line_hunks(old, new)
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


def unified_diff_text(before: Mapping[str, str], after: Mapping[str, str]) -> str:
  """A git-style unified diff of every path whose content differs."""
  out = []
  for path in sorted(after):
    old, new = before.get(path, ""), after[path]
    if old != new:
      out.append(render_unified_diff(path, old, new))
  return "\n".join(out)
