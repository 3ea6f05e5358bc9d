"""Patches between trees of files: git-style unified diffs, written and applied.

A tree is a mapping path -> text. `render(before, after)` writes the diff that takes
`before` to `after` for the paths of `after` (a value of None deletes the path) as `git
diff` does: a `diff --git a/P b/P` line, `new file mode` / `deleted file mode` where they
apply, `---`/`+++` headers and hunks with 3 context lines (difflib's alignment, not git's,
so the hunks may differ from git's while meaning the same), so `git apply` and `patch
-p1` take it (the SWE-bench harness applies patches with them). `apply(files, text)`
applies such a diff, or any unified diff whose hunks match exactly (rlcode.data.edits
parses the hunks), and deletes the files whose `+++` is /dev/null.

Which paths are tests (`is_test_path`): a path with a directory named test, tests or
testing, a file named test_*.py, *_test.py or conftest.py. A PR's changes to them are its
test patch; its changes to other Python files are its code patch.

This module must not run anything: it computes texts.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from collections.abc import Mapping

from rlcode.data import edits

TEST_DIRS = ("test", "tests", "testing")
CODE_SUFFIXES = (".py", ".pyi")
_SECTION = re.compile(r"^diff --git ", re.MULTILINE)


def is_test_path(path: str) -> bool:
  parts = path.split("/")
  name = parts[-1]
  return (any(p in TEST_DIRS for p in parts[:-1]) or name == "conftest.py"
          or (name.startswith("test_") and name.endswith(".py"))
          or name.endswith("_test.py"))


def is_test_module(path: str) -> bool:
  """A file pytest collects by default: test_*.py or *_test.py."""
  name = posixpath.basename(path)
  return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def is_code_path(path: str) -> bool:
  return path.endswith(CODE_SUFFIXES) and not is_test_path(path)


def _range(start: int, stop: int) -> str:
  n = stop - start
  return f"{start + 1 if n else start},{n}"


def _hunks(old: str, new: str) -> list[str]:
  """The hunk lines taking `old` to `new`, each hunk's lines in its group's order.

  Each hunk is rendered from its own group of opcodes (3 lines of context), so a hunk in
  the middle of a file has as many context lines after its changes as before them:
  GNU patch and `git apply` read a hunk with fewer lines of context at its end than at its
  start as one that ends the file, so re-diffing a hunk's lines (which may align them
  otherwise) makes patches they refuse."""
  a, b = edits.split_keepends(old), edits.split_keepends(new)
  out = []

  def emit(prefix: str, line: str) -> None:
    out.append(prefix + line[:-1] if line.endswith("\n") else prefix + line)
    if not line.endswith("\n"):
      out.append("\\ No newline at end of file")

  matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
  for group in matcher.get_grouped_opcodes(3):
    out.append(f"@@ -{_range(group[0][1], group[-1][2])} "
               f"+{_range(group[0][3], group[-1][4])} @@")
    for tag, i1, i2, j1, j2 in group:
      if tag == "equal":
        for line in a[i1:i2]:
          emit(" ", line)
        continue
      for line in a[i1:i2]:
        emit("-", line)
      for line in b[j1:j2]:
        emit("+", line)
  return out


def _file_diff(path: str, old: str | None, new: str | None) -> str:
  head = [f"diff --git a/{path} b/{path}"]
  if old is None:
    head.append("new file mode 100644")
  elif new is None:
    head.append("deleted file mode 100644")
  body = _hunks(old or "", new or "")
  if not body:  # an empty file added or deleted: git writes no ---/+++ lines
    return "\n".join(head)
  return "\n".join(head + ["--- /dev/null" if old is None else f"--- a/{path}",
                            "+++ /dev/null" if new is None else f"+++ b/{path}", *body])


def render(before: Mapping[str, str], after: Mapping[str, str | None]) -> str:
  """The git-style diff taking `before` to `after` on the paths of `after` (None:
  deleted); paths whose text is unchanged are left out. Ends with a newline unless
  empty."""
  parts = []
  for path in sorted(after):
    old, new = before.get(path), after[path]
    if old == new or (old is None and new is None):
      continue
    parts.append(_file_diff(path, old, new))
  return "".join(p + "\n" for p in parts)


def paths(text: str) -> list[str]:
  """The paths a diff touches, in order (from its +++ lines, or --- for a deletion)."""
  out = []
  lines = text.split("\n")
  for i, line in enumerate(lines):
    if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
      new = lines[i + 1][4:].split("\t")[0]
      old = line[4:].split("\t")[0]
      path = old[2:] if new == "/dev/null" else new[2:] if new.startswith("b/") else new
      out.append(path)
    elif line.startswith("diff --git ") and (i + 1 >= len(lines) or not any(
        lines[j].startswith("--- ") for j in range(i + 1, min(i + 4, len(lines))))):
      out.append(line.split(" b/", 1)[-1])  # an empty file added or deleted
  return out


def apply(files: Mapping[str, str], text: str) -> dict[str, str | None]:
  """path -> new text (None: deleted) of every path the diff touches (none for an empty
  diff).

  Raises:
    edits.FormatError: a hunk does not apply, a deleted file's text is not what the
      diff removes, or a malformed diff.
  """
  out: dict[str, str | None] = {}
  if not text.strip():
    return out
  sections = [s for s in _SECTION.split(text) if s.strip()] if _SECTION.search(text) else [text]
  for section in sections:
    lines = section.split("\n")
    header = lines[0]
    if "deleted file mode" in section.split("@@", 1)[0] or "\n+++ /dev/null" in section:
      path = next((ln[6:].split("\t")[0] for ln in lines if ln.startswith("--- a/")),
                  header.split(" b/", 1)[-1].strip())
      removed = "".join(ln[1:] + "\n" for ln in lines if ln.startswith("-")
                        and not ln.startswith("--- "))
      if path not in files or edits.normalized_patch(files[path], removed):
        raise edits.FormatError("hunk_does_not_apply",
                                f"{path}: the deleted text is not the file's")
      out[path] = None
      continue
    parsed = edits.parse_unified_diff(section)
    if not parsed and "new file mode" in section:  # an empty file added
      out[header.split(" b/", 1)[-1].strip()] = ""
      continue
    if not parsed:
      raise edits.FormatError("no_edits", "a diff section with no hunk")
    for path, new in edits.apply_unified_diff({**files, **{p: t for p, t in out.items()
                                                           if t is not None}},
                                              parsed).items():
      out[path] = new
  return out


def applied(files: Mapping[str, str], text: str) -> dict[str, str]:
  """`files` with the diff applied (deleted paths removed)."""
  tree = dict(files)
  for path, new in apply(files, text).items():
    if new is None:
      tree.pop(path, None)
    else:
      tree[path] = new
  return tree
