"""SWE-RL's SEARCH/REPLACE edits: parsing, applying, rendering an oracle's.

Semantics follow facebookresearch/swe-rl (src/swerl/core/reward.py) exactly: exactly one
of each tag, a non-empty thought, blocks matched by the same pattern, a path absent
from the files is an empty (new) file, each SEARCH must occur at a line start ("\\n" +
search in "\\n" + content), and every occurrence is replaced.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from rlcode.data.edits import common


# One SEARCH/REPLACE block; the same language as SWE-RL's SEARCH_REPLACE_REGEX:
# a fence line, "### path", then lazily matched search and replace texts.
_BLOCK_RE = re.compile(
    r"```.*?\n### (.*)\n<<<<<<< SEARCH\n([\s\S]*?)\n=======\n([\s\S]*?)"
    r"\n>>>>>>> REPLACE\n```")


_LANGUAGE_TAGS = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".tsx": "typescript", ".go": "go", ".rs": "rust",
    ".java": "java", ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp",
    ".hpp": "cpp", ".rb": "ruby", ".sh": "bash", ".md": "markdown",
}


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
        raise common.FormatError("search_equals_replace",
                          f"{path}: a SEARCH block equals its REPLACE block")
      if "\n" + search not in content:
        raise common.FormatError("search_not_found",
                          f"{path}: SEARCH text not found: {search[:200]!r}")
      content = content.replace("\n" + search, "\n" + replace)
    out[path] = content[1:]
  return out


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


def file_blocks(path: str, old: str, new: str, context: int) -> list[str]:
  """SEARCH/REPLACE blocks taking `old` to `new`, each unique when applied.

  Each block starts as a hunk with `context` unchanged lines around its change
  and grows a line on each side until its SEARCH text occurs once (an empty
  SEARCH, a pure insertion with no context, never does in a non-empty file).
  """
  a, b, groups = common.line_hunks(old, new, context)
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
