"""Splitting a document into sections: Markdown, reStructuredText, Python and plain text.

A document is split into consecutive sections whose raw texts concatenate back
to the document (after line endings are normalised to "\\n"):

- Markdown (.md, .markdown): a section starts at each ATX heading (`## Title`)
  or setext heading (a paragraph underlined with `===` or `---`); lines inside
  fenced code blocks and YAML front matter are never headings.
- reStructuredText (.rst): a section starts at each title, a non-indented line
  underlined (optionally also overlined) with one repeated punctuation
  character at least as long as the title; a title follows a blank line, the
  start of the document or another title.
- Python (.py): the module docstring, imports and everything before the first
  top-level `def`/`class` is a leading section; each top-level definition is a
  section whose heading is the comment lines directly above it (no blank line
  between), its decorators and its signature up to the colon, and whose body is
  the rest of the definition (docstring and code). Top-level code between
  definitions is a context-only section. A file that does not parse is split as
  plain text (counted as `python_syntax_fallback`).
- Plain text (.txt and explicitly named files of other suffixes): blank-line
  separated blocks, merged forward until a section holds at least
  `min_block_chars` characters (not counting its leading and trailing
  whitespace); a short remainder joins the last section. Sections have no
  heading.

This module must not make tasks or read files: it cuts text.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import string
import tokenize

from rlcode import pyast

FORMATS = ("markdown", "rst", "python", "text")

# Section kinds: only "heading" and "block" sections can be targets.
TARGET_KINDS = ("heading", "block")


@dataclasses.dataclass(frozen=True)
class Section:
  """A contiguous piece of a document.

  Attributes:
    heading: the raw heading lines ("" for none), ending in a newline.
    body: the raw text after the heading, up to the next section.
    kind: "preamble" (before the first heading), "heading" (a Markdown/RST
      title or a Python definition), "code" (top-level Python code between
      definitions) or "block" (plain text).
    title: the heading's text (Python: the definition's name), else "".
  """

  heading: str
  body: str
  kind: str
  title: str = ""

  @property
  def text(self) -> str:
    return self.heading + self.body


@dataclasses.dataclass(frozen=True)
class Document:
  """A decoded document: `id` is unique in a corpus, `name` its fallback title."""

  id: str
  text: str
  format: str
  name: str


def _lines(text: str) -> list[str]:
  # Only "\n" ends a line: str.splitlines also splits on form feeds and other
  # separators that the standard library's sources contain.
  parts = text.split("\n")
  return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _sections_at(lines: list[str], heads: list[tuple[int, int, str]]
                 ) -> list[Section]:
  """Cuts `lines` at headings given as (first line, end line, title)."""
  sections = []
  if not heads or heads[0][0] > 0:
    end = heads[0][0] if heads else len(lines)
    sections.append(Section("", "".join(lines[:end]), "preamble"))
  for k, (start, end, title) in enumerate(heads):
    stop = heads[k + 1][0] if k + 1 < len(heads) else len(lines)
    sections.append(Section("".join(lines[start:end]),
                            "".join(lines[end:stop]), "heading", title))
  return sections


_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})(.*)$")
_SETEXT = re.compile(r" {0,3}(=+|-+)[ \t]*$")
_THEMATIC_BREAK = re.compile(r" {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_LIST_OR_QUOTE = re.compile(r" {0,3}(?:>|[-+*][ \t]|\d{1,9}[.)][ \t])")


def split_markdown(text: str) -> list[Section]:
  """Splits Markdown at ATX and setext headings (see the module docstring)."""
  lines = _lines(text)
  heads: list[tuple[int, int, str]] = []
  start = 0
  if lines and lines[0].rstrip() == "---":
    for j in range(1, len(lines)):
      if lines[j].rstrip() in ("---", "..."):
        start = j + 1
        break
  fence: tuple[str, int] | None = None
  # First line of the open paragraph; -1 inside another block (list, quote,
  # indented code) whose lines cannot become a setext heading; None between.
  para: int | None = None
  for i in range(start, len(lines)):
    s = lines[i].rstrip("\n")
    if fence is not None:
      close = re.match(r" {0,3}(`{3,}|~{3,})[ \t]*$", s)
      if close and close.group(1)[0] == fence[0] and len(close.group(1)) >= fence[1]:
        fence = None
      continue
    m = _FENCE_OPEN.match(s)
    if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
      fence, para = (m.group(1)[0], len(m.group(1))), None
      continue
    if not s.strip():
      para = None
      continue
    m = _ATX.match(s)
    if m:
      heads.append((i, i + 1, (m.group(2) or "").strip()))
      para = None
      continue
    if para is not None and para >= 0 and _SETEXT.match(s):
      heads.append((para, i + 1, " ".join(l.strip() for l in lines[para:i])))
      para = None
      continue
    if _THEMATIC_BREAK.match(s):
      para = None
      continue
    if para is None:
      indent = len(s.expandtabs(4)) - len(s.expandtabs(4).lstrip(" "))
      para = -1 if indent >= 4 or _LIST_OR_QUOTE.match(s) else i
  return _sections_at(lines, heads)


_ADORNMENT_CHARS = frozenset(string.punctuation)


def _adornment(line: str) -> str | None:
  s = line.rstrip()
  if s and s[0] in _ADORNMENT_CHARS and s == s[0] * len(s):
    return s[0]
  return None


def split_rst(text: str) -> list[Section]:
  """Splits reStructuredText at section titles (see the module docstring)."""
  lines = _lines(text)
  heads: list[tuple[int, int, str]] = []
  after_break = True  # at the start, after a blank line or after a title
  i = 0
  while i < len(lines):
    s = lines[i].rstrip()
    if after_break and i + 2 < len(lines) and _adornment(s):
      title, under = lines[i + 1].strip(), lines[i + 2].rstrip()
      if (title and under == s and len(s) >= len(title)):
        heads.append((i, i + 3, title))
        i += 3
        continue
    if (after_break and i + 1 < len(lines) and s and not s[0].isspace()
        and not _adornment(s)):
      under = lines[i + 1].rstrip()
      if _adornment(under) and len(under) >= len(s):
        heads.append((i, i + 2, s))
        i += 2
        continue
    after_break = not s
    i += 1
  return _sections_at(lines, heads)


def _header_end_rows(text: str) -> list[tuple[int, int]]:
  """Positions (row, col) of every ':' outside brackets, in order."""
  rows, depth = [], 0
  for tok in tokenize.generate_tokens(io.StringIO(text).readline):
    if tok.type != tokenize.OP:
      continue
    if tok.string in "([{":
      depth += 1
    elif tok.string in ")]}":
      depth -= 1
    elif tok.string == ":" and depth == 0:
      rows.append(tok.start)
  return rows


def split_python(text: str) -> list[Section]:
  """Splits a Python module at top-level definitions (see the module docstring).

  Raises:
    SyntaxError: `text` is not valid Python (also for tokenizer errors).
  """
  try:
    tree = pyast.parse(text)
    colons = _header_end_rows(text)
  except (tokenize.TokenError, ValueError) as e:
    raise SyntaxError(str(e)) from e
  lines = _lines(text)
  defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
  spans = []  # (first line, header end line, end line) as 0-based, end-exclusive
  prev_end = 0
  for node in tree.body:
    if isinstance(node, defs):
      first = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
      while (first - 1 >= prev_end
             and lines[first - 1].lstrip().startswith("#")):
        first -= 1
      colon_row = next(r for r, c in colons if (r, c) > (node.lineno, node.col_offset))
      spans.append((first, colon_row, node.end_lineno, node.name))
    prev_end = node.end_lineno
  if not spans:
    return [Section("", text, "preamble")]
  sections = []
  if spans[0][0] > 0:
    sections.append(Section("", "".join(lines[:spans[0][0]]), "preamble"))
  for k, (first, header_end, end, name) in enumerate(spans):
    stop = spans[k + 1][0] if k + 1 < len(spans) else len(lines)
    code = next((j for j in range(end, stop) if lines[j].strip()), stop)
    sections.append(Section("".join(lines[first:header_end]),
                            "".join(lines[header_end:code]), "heading", name))
    if code < stop:
      sections.append(Section("", "".join(lines[code:stop]), "code"))
  return sections


def split_text(text: str, min_block_chars: int = 200) -> list[Section]:
  """Splits plain text into blank-line blocks merged to >= `min_block_chars`."""
  if min_block_chars < 0:
    raise ValueError(f"min_block_chars={min_block_chars} must be >= 0")
  blocks: list[str] = []
  for line in _lines(text):
    # A non-blank line after a blank one starts a block; blank lines stay with
    # the block they follow, so the blocks concatenate back to the text.
    if line.strip() and blocks and not blocks[-1].splitlines()[-1].strip():
      blocks.append(line)
    elif blocks:
      blocks[-1] += line
    else:
      blocks.append(line)
  merged: list[str] = []
  current = ""
  for block in blocks:
    current += block
    if len(current.strip()) >= min_block_chars:
      merged.append(current)
      current = ""
  if current:
    if merged:
      merged[-1] += current
    else:
      merged.append(current)
  return [Section("", block, "block") for block in merged]


def split_document(doc: Document, min_block_chars: int = 200
                   ) -> tuple[list[Section], bool]:
  """Sections of `doc` and whether a Python file fell back to plain text."""
  if doc.format == "markdown":
    return split_markdown(doc.text), False
  if doc.format == "rst":
    return split_rst(doc.text), False
  if doc.format == "python":
    try:
      return split_python(doc.text), False
    except SyntaxError:
      return split_text(doc.text, min_block_chars), True
  if doc.format == "text":
    return split_text(doc.text, min_block_chars), False
  raise ValueError(f"document {doc.id!r}: unknown format {doc.format!r}; "
                   f"formats are {FORMATS}")
