"""The prompt of a diff task: the request, the files as shown, the answer format.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from rlcode.data.edits import common
from rlcode.data.edits import line_edit


_THINKING = f"""\
Answer in two parts. First think the problem through inside {common.THINK_START} \
{common.THINK_END}: as long and as informal as you need. Then give the final answer \
inside {common.SOLUTION_START} {common.SOLUTION_END}:
{common.THINK_START}
your reasoning
{common.THINK_END}
{common.SOLUTION_START}
your edits
{common.SOLUTION_END}"""


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
  if edit_format not in common.EDIT_FORMATS:
    raise ValueError(f"edit_format={edit_format!r}; expected one of "
                     f"{common.EDIT_FORMATS}")
  new_files = set(new_files)
  if edit_format == "line_edit":
    for path in sorted(set(files) - new_files):
      bare = [line.rstrip("\n") for line in common.split_keepends(files[path])
              if not line_edit.NUMBERED_RE.match(line)
              and not line_edit.OMITTED_RE.match(line.rstrip("\n"))
              and not line_edit.OMITTED_COUNT_RE.match(line.rstrip("\n"))]
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
