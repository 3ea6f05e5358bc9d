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

This package turns a completion into new file contents (`apply_completion`),
raising `FormatError` for anything that cannot apply; renders an oracle answer
in any of the formats (`oracle_completion`, used as a task's reference and to prove
every mined oracle is expressible); and writes the prompt (`build_prompt`).
`normalized_patch` is the per-file diff text the SWE-RL reward compares; it is
here because the miner must use the very same definition to reject changes the
reward cannot see. This package must not score (rlcode.rewards.diffs does) nor
know where tasks come from (rlcode.data.git).

  common.py          the tags, FormatError, normalized_patch, line bookkeeping
  search_replace.py  SWE-RL's SEARCH/REPLACE blocks (its semantics exactly)
  unified_diff.py    unified diffs
  line_edit.py       LINES blocks over numbered prompt lines; shown-line numbering
  prompt.py          the task's prompt
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rlcode.data.edits import common, line_edit, search_replace, unified_diff
from rlcode.data.edits.common import (EDIT_FORMATS, SOLUTION_END, SOLUTION_START, THINK_END,
                                      THINK_START, FormatError, extract_thought_solution,
                                      line_hunks, normalized_patch, split_keepends)
from rlcode.data.edits.line_edit import (apply_line_edits, count_shown_lines, file_ranges,
                                         locating_thought, number_lines, omitted_lines,
                                         parse_line_edits, shift_line_numbers, shown_ranges)
from rlcode.data.edits.prompt import build_prompt
from rlcode.data.edits.search_replace import apply_search_replace, parse_search_replace
from rlcode.data.edits.unified_diff import (apply_unified_diff, parse_unified_diff,
                                            unified_diff_text)

__all__ = ["EDIT_FORMATS", "SOLUTION_END", "SOLUTION_START", "THINK_END", "THINK_START",
           "FormatError", "apply_completion", "apply_line_edits", "apply_search_replace",
           "apply_unified_diff", "build_prompt", "count_shown_lines", "extract_thought_solution",
           "file_ranges", "line_hunks", "locating_thought", "normalized_patch", "number_lines",
           "omitted_lines", "oracle_completion", "parse_line_edits", "parse_search_replace",
           "parse_unified_diff", "shift_line_numbers", "shown_ranges",
           "split_keepends", "unified_diff_text"]


def apply_completion(completion: str, files: Mapping[str, str],
                     edit_format: str = "search_replace", open_file: str = "",
                     shown_lines: Mapping[str, Sequence[int]] | None = None
                     ) -> dict[str, str]:
  """path -> new content for every file the completion edits.

  `open_file`: line_edit only, the file of a block that names none (the task's
  `extra.open_file`: the one file its prompt shows; parse_line_edits).
  `shown_lines`: line_edit only, for a prompt whose numbers count the lines it shows
  (the task's `extra.shown_lines`, `count_shown_lines`): each shown file's numbers of
  its shown lines, which the ranges are mapped through (`file_ranges`); None: ranges
  are the files' own numbers.

  Raises:
    FormatError: anything that keeps the completion from applying.
    ValueError: an unknown edit format.
  """
  if edit_format not in common.EDIT_FORMATS:
    raise ValueError(f"edit_format={edit_format!r}; expected one of "
                     f"{common.EDIT_FORMATS}")
  _, solution = common.extract_thought_solution(completion)
  if edit_format == "search_replace":
    edits = search_replace.parse_search_replace(solution)
    if not edits:
      raise common.FormatError("no_edits", "no SEARCH/REPLACE block in the solution")
    return search_replace.apply_search_replace(files, edits)
  if edit_format == "line_edit":
    blocks = line_edit.parse_line_edits(solution, open_file)
    if not blocks:
      raise common.FormatError("no_edits", "no LINES block in the solution")
    if shown_lines is not None:
      blocks = line_edit.file_ranges(blocks, shown_lines)
    return line_edit.apply_line_edits(files, blocks)
  patches = unified_diff.parse_unified_diff(solution)
  if not patches:
    raise common.FormatError("no_edits", "no unified diff hunk in the solution")
  return unified_diff.apply_unified_diff(files, patches)


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
  if edit_format not in common.EDIT_FORMATS:
    raise ValueError(f"edit_format={edit_format!r}; expected one of "
                     f"{common.EDIT_FORMATS}")
  parts = []
  for path in sorted(oracle):
    old, new = files.get(path, ""), oracle[path]
    if old == new:
      continue
    if edit_format == "search_replace":
      parts.extend(search_replace.file_blocks(path, old, new, context_lines))
    elif edit_format == "line_edit":
      parts.extend(line_edit.line_blocks(path, old, new, context_lines, named=path != open_file,
                                counted=line_counts))
    else:
      parts.append("```diff\n" + unified_diff.render_unified_diff(path, old, new) + "\n```")
  completion = (f"{common.THINK_START}\n{thought}\n{common.THINK_END}\n{common.SOLUTION_START}\n"
                + "\n\n".join(parts) + f"\n{common.SOLUTION_END}")
  try:
    applied = apply_completion(completion, files, edit_format, open_file)
  except common.FormatError as e:
    raise ValueError(f"the oracle cannot be written as {edit_format}: {e}") from e
  for path in sorted(set(applied) | set(oracle)):
    want = oracle.get(path, files.get(path, ""))
    if applied.get(path, files.get(path, "")) != want:
      raise ValueError(f"the oracle cannot be written as {edit_format}: "
                       f"{path} comes out different")
  return completion
