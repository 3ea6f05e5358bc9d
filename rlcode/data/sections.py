"""Whole-section prediction tasks: documents split into sections, next section as target.

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

A task is made for every section that has a heading (or is a plain-text block),
has a non-blank section before it, and whose target has at least
`min_target_chars` characters and at most `max_target_tokens` tokens:

    prompt    = "<title>\\n\\n" + <preceding sections, raw> + <the section's heading>
    reference = the section's body without leading blank lines and trailing
                whitespace

The title is the text of the first heading of a Markdown/RST document that
starts with one (then it is not repeated while that heading is still in the
context), else the document's name (its id). The context is trimmed from
the front to the token budget: `count(title line) + count(context) +
count(heading) <= context_budget`, with `count` the tokenizer callable given
(default: whitespace-separated words) applied per section and summed. Whole
sections are dropped from the front; when even the nearest preceding section
does not fit, its longest fitting tail is kept, cut at a line start (at a
whitespace boundary when no line-start tail with text fits). When nothing but
blank text fits beside the title and heading, the task is skipped
(`over_budget`).

Splits are by document, so no document is in both: a document is held out
("test") when the first 8 bytes of sha256(document id), as an integer, modulo
10_000 fall below `held_out_fraction * 10_000`; the rest is "train".

Sources are local files and directories or gs:// paths (read through
etils.epath, which uses gcsfs). Directories are walked recursively in sorted
order, taking .md/.markdown/.rst/.py/.txt files; hidden files and directories
(each counted once, a directory's contents unread) and other suffixes are
skipped and counted. A document's id is "<source directory name>/<path in
it>" (a file source: its name). Files are decoded as UTF-8 (BOM allowed;
Python files by their PEP 263 coding cookie); a file that contains a NUL byte in
its first 8 KiB (binary), does not decode, or is empty or whitespace-only is
skipped and counted, never fatal. A document with a single section (no
headings, one text block) gives no task and is counted.

The embedded corpus needs no download: every topic of `pydoc_data.topics`
(79 topics, the same names in Python 3.10-3.13; split as reStructuredText,
document id `pydoc/<topic>`) and the standard-library modules in
`STDLIB_MODULES` (single files in 3.11-3.13; document id `stdlib/<name>.py`),
read from `sysconfig.get_paths()["stdlib"]`. Their text is the running
Python's, so counts can change between Python releases (and rarely between
patch releases); the builder's cache name includes the Python version. With
the default SectionOptions, Python 3.11.7 gives 118 documents (98 train, 20
test) and 645 train / 48 test tasks; 3.12.1 gives 664 / 53 and 3.13.0 685 / 55
(tests/test_sections.py pins these).

This module must not tokenize for a model or touch rewards; it only makes Tasks.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import hashlib
import io
import json
import pathlib
import re
import string
import sys
import sysconfig
import tokenize
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import tensorflow_datasets as tfds
from etils import epath

from rlcode.data.tasks import Task, TaskBuilder

SUFFIX_FORMATS = {".md": "markdown", ".markdown": "markdown", ".rst": "rst",
                  ".py": "python", ".txt": "text"}
FORMATS = ("markdown", "rst", "python", "text")
SPLITS = ("train", "test")
# Every count a build reports (zeros included), so reports of builds compare.
COUNT_KEYS = (
    "documents", "documents_train", "documents_test", "sections_train",
    "sections_test", "tasks_train", "tasks_test", "single_section_documents",
    "documents_without_tasks", "targets_too_short", "targets_too_long",
    "over_budget", "python_syntax_fallback", "skipped_binary",
    "skipped_undecodable", "skipped_empty", "skipped_hidden", "skipped_suffix",
)

# Single-file pure-Python modules present, as files, in Python 3.11, 3.12 and 3.13.
STDLIB_MODULES = (
    "abc", "argparse", "base64", "bisect", "calendar", "colorsys",
    "contextlib", "copy", "csv", "dataclasses", "difflib", "enum", "fnmatch",
    "fractions", "functools", "gettext", "glob", "heapq", "hmac", "ipaddress",
    "linecache", "numbers", "operator", "pprint", "queue", "random", "reprlib",
    "sched", "secrets", "shlex", "shutil", "statistics", "string", "textwrap",
    "tokenize", "types", "uuid", "warnings", "weakref",
)

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


def whitespace_tokens(text: str) -> int:
  """The default token count: whitespace-separated words."""
  return len(text.split())


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
    tree = ast.parse(text)
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


def _trim_blank(text: str) -> str:
  """Drops leading blank lines (keeping the first line's indent) and trailing space."""
  return re.sub(r"\A(?:[ \t]*\n)+", "", text).rstrip()


def _tail_within(text: str, budget: int, count: Callable[[str], int]) -> str:
  """The longest tail of `text` with count <= budget, cut at a line start if any
  line-start tail fits, else at a word start."""

  def longest(starts: list[int]) -> str:
    lo, hi = 0, len(starts)  # first index whose tail fits is in [lo, hi]
    while lo < hi:
      mid = (lo + hi) // 2
      if count(text[starts[mid]:]) <= budget:
        hi = mid
      else:
        lo = mid + 1
    return text[starts[lo]:] if lo < len(starts) else ""

  tail = longest([0] + [m.end() for m in re.finditer(r"\n", text)
                        if m.end() < len(text)])
  if tail.strip():
    return tail
  return longest([0] + [m.end() for m in re.finditer(r"\s+", text)])


@dataclasses.dataclass(frozen=True)
class SectionOptions:
  """How documents become tasks.

  Attributes:
    context_budget: max tokens of title line + context + heading.
    min_target_chars: targets shorter than this (after trimming) are skipped.
    max_target_tokens: targets counting more tokens than this are skipped.
    min_block_chars: minimum size of a plain-text section.
    held_out_fraction: the fraction of documents (by hash) in "test".
  """

  context_budget: int = 1024
  min_target_chars: int = 20
  max_target_tokens: int = 512
  min_block_chars: int = 200
  held_out_fraction: float = 0.2

  def __post_init__(self):
    if self.context_budget < 1:
      raise ValueError(f"context_budget={self.context_budget} must be >= 1")
    if self.min_target_chars < 1:
      raise ValueError(f"min_target_chars={self.min_target_chars} must be >= 1")
    if self.max_target_tokens < 1:
      raise ValueError(f"max_target_tokens={self.max_target_tokens} must be >= 1")
    if self.min_block_chars < 0:
      raise ValueError(f"min_block_chars={self.min_block_chars} must be >= 0")
    if not 0.0 <= self.held_out_fraction <= 1.0:
      raise ValueError(f"held_out_fraction={self.held_out_fraction} must be "
                       "in [0, 1]")


def split_of(doc_id: str, held_out_fraction: float) -> str:
  """"test" or "train" for a document, from a stable hash of its id."""
  h = int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big")
  return "test" if h % 10_000 < held_out_fraction * 10_000 else "train"


def document_title(doc: Document, sections: Sequence[Section]) -> tuple[str, int]:
  """The title and the index of the section it came from (-1: the doc's name)."""
  for k, sec in enumerate(sections):
    if sec.kind == "heading" and doc.format in ("markdown", "rst"):
      return sec.title, k
    if sec.text.strip():
      break
  return doc.name, -1


def make_tasks(doc: Document, sections: Sequence[Section], *,
               options: SectionOptions = SectionOptions(),
               count_tokens: Callable[[str], int] = whitespace_tokens,
               stats: collections.Counter | None = None) -> list[Task]:
  """The section-prediction tasks of one split document (module docstring)."""
  stats = collections.Counter() if stats is None else stats
  title, title_section = document_title(doc, sections)
  counts = [count_tokens(s.text) for s in sections]
  tasks = []
  for i, sec in enumerate(sections):
    if i == 0 or sec.kind not in TARGET_KINDS:
      continue
    if not any(s.text.strip() for s in sections[:i]):
      continue
    target = _trim_blank(sec.body)
    if len(target) < options.min_target_chars:
      stats["targets_too_short"] += 1
      continue
    if count_tokens(target) > options.max_target_tokens:
      stats["targets_too_long"] += 1
      continue
    head = f"{title}\n\n"
    room = options.context_budget - count_tokens(head) - count_tokens(sec.heading)
    first, used = i, 0
    while first > 0 and used + counts[first - 1] <= room:
      used += counts[first - 1]
      first -= 1
    if first < i:
      context = "".join(s.text for s in sections[first:i])
    else:
      context = _tail_within(sections[i - 1].text, max(room, 0), count_tokens)
    if not context.strip():
      stats["over_budget"] += 1
      continue
    # Only blank sections precede the title's heading, so the context already
    # opens with the title when it reaches back to that heading.
    if first < i and 0 <= title_section and first <= title_section:
      head = ""
    tasks.append(Task(
        id=f"{doc.id}#{i}", prompt=head + context + sec.heading, kind="section",
        reference=target,
        extra={"document": doc.id, "section": i, "heading": sec.title,
               "format": doc.format, "context_truncated": first > 0}))
  return tasks


def _normalise_newlines(text: str) -> str:
  return text.replace("\r\n", "\n").replace("\r", "\n")


def decode_document(data: bytes, fmt: str) -> tuple[str | None, str]:
  """Decodes file bytes: (text, "") or (None, the reason it is skipped)."""
  if b"\x00" in data[:8192]:
    return None, "skipped_binary"
  try:
    if fmt == "python":
      encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
      text = data.decode(encoding)
      text = text.removeprefix("\ufeff")
    else:
      text = data.decode("utf-8-sig")
  except (UnicodeDecodeError, SyntaxError, LookupError):
    # SyntaxError/LookupError: a malformed or unknown PEP 263 coding cookie.
    return None, "skipped_undecodable"
  if not text.strip():
    return None, "skipped_empty"
  return _normalise_newlines(text), ""


def _source_files(source: str, stats: collections.Counter
                  ) -> list[tuple[epath.Path, str, str]]:
  """(path, document id, format) of the files a source names, sorted."""
  root = epath.Path(source)
  if root.is_file():
    return [(root, root.name, SUFFIX_FORMATS.get(root.suffix.lower(), "text"))]
  if not root.is_dir():
    raise FileNotFoundError(f"sections source {source!r} is neither a file nor "
                            "a directory")
  prefix = str(root).rstrip("/") + "/"
  found = []
  # walk, not rglob: epath refuses recursive globs (costly on GCS).
  for folder, dirnames, filenames in root.walk():
    hidden = [d for d in dirnames if d.startswith(".")]
    stats["skipped_hidden"] += len(hidden)
    dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    for name in sorted(filenames):
      if name.startswith("."):
        stats["skipped_hidden"] += 1
        continue
      path = folder / name
      fmt = SUFFIX_FORMATS.get(path.suffix.lower())
      if fmt is None:
        stats["skipped_suffix"] += 1
        continue
      found.append((path, f"{root.name}/{str(path)[len(prefix):]}", fmt))
  return sorted(found, key=lambda f: f[1])


def read_documents(sources: Sequence[str], stats: collections.Counter | None = None
                   ) -> list[Document]:
  """Decoded documents of local or gs:// files and directories (module doc)."""
  stats = collections.Counter() if stats is None else stats
  if isinstance(sources, str):
    raise TypeError(f"sources must be a sequence of paths, got the string {sources!r}")
  docs, seen = [], {}
  for source in sources:
    for path, doc_id, fmt in _source_files(source, stats):
      if doc_id in seen:
        raise ValueError(f"sections sources {seen[doc_id]!r} and {source!r} both "
                         f"give the document id {doc_id!r}; rename a directory")
      seen[doc_id] = source
      text, reason = decode_document(path.read_bytes(), fmt)
      if text is None:
        stats[reason] += 1
        continue
      docs.append(Document(doc_id, text, fmt, doc_id))
  return docs


def embedded_documents() -> list[Document]:
  """The corpus shipped with Python: pydoc topics and STDLIB_MODULES (module doc)."""
  from pydoc_data import topics  # pylint: disable=import-outside-toplevel

  docs = [Document(f"pydoc/{name}", _normalise_newlines(topics.topics[name]),
                   "rst", name) for name in sorted(topics.topics)]
  stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
  for name in STDLIB_MODULES:
    path = stdlib / f"{name}.py"
    if not path.is_file():
      raise FileNotFoundError(f"embedded sections corpus: {path} is missing from "
                              "this Python installation")
    text, reason = decode_document(path.read_bytes(), "python")
    if text is None:
      raise ValueError(f"embedded sections corpus: {path} is unusable ({reason})")
    docs.append(Document(f"stdlib/{name}.py", text, "python", f"{name}.py"))
  return docs


def build_tasks(documents: Iterable[Document], *,
                options: SectionOptions = SectionOptions(),
                count_tokens: Callable[[str], int] = whitespace_tokens,
                stats: collections.Counter | None = None
                ) -> dict[str, list[Task]]:
  """Splits documents and makes tasks: {"train": [...], "test": [...]}.

  `stats` (a Counter, updated in place) receives documents, sections and tasks
  per split, and the counts of everything skipped.
  """
  stats = collections.Counter() if stats is None else stats
  splits: dict[str, list[Task]] = {name: [] for name in SPLITS}
  for doc in documents:
    sections, fell_back = split_document(doc, options.min_block_chars)
    stats["python_syntax_fallback"] += fell_back
    split = split_of(doc.id, options.held_out_fraction)
    tasks = make_tasks(doc, sections, options=options, count_tokens=count_tokens,
                       stats=stats)
    stats["documents"] += 1
    stats[f"documents_{split}"] += 1
    stats[f"sections_{split}"] += len(sections)
    stats[f"tasks_{split}"] += len(tasks)
    if len(sections) == 1:
      stats["single_section_documents"] += 1
    elif not tasks:
      stats["documents_without_tasks"] += 1
    splits[split].extend(tasks)
  return splits




def collect(sources: Sequence[str] = (), *,
            options: SectionOptions = SectionOptions(),
            count_tokens: Callable[[str], int] = whitespace_tokens
            ) -> tuple[dict[str, list[Task]], dict[str, int]]:
  """Tasks per split and the counts (COUNT_KEYS) of a build.

  Args:
    sources: local or gs:// files and directories; empty means the embedded
      corpus.
    options: SectionOptions.
    count_tokens: text -> token count for the budgets.
  """
  stats = collections.Counter({k: 0 for k in COUNT_KEYS})
  docs = read_documents(sources, stats) if sources else embedded_documents()
  splits = build_tasks(docs, options=options, count_tokens=count_tokens,
                       stats=stats)
  return splits, {k: stats[k] for k in COUNT_KEYS}


@dataclasses.dataclass(eq=False)
class SectionsConfig(tfds.core.BuilderConfig):
  """The arguments of a SectionTasks build (its name keys the tfds cache)."""

  sources: tuple[str, ...] = ()
  options: SectionOptions = SectionOptions()
  count_tokens_name: str = "words"


class SectionTasks(TaskBuilder):
  """Whole-section prediction tasks from Markdown, RST, Python and text documents."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, data_dir: str, sources: Sequence[str] = (),
               options: SectionOptions = SectionOptions(),
               count_tokens: Callable[[str], int] | None = None,
               count_tokens_name: str | None = None, **kwargs):
    """Makes the builder; its cache name is a hash of all arguments.

    Args:
      data_dir: where tfds writes the dataset.
      sources: local or gs:// files and directories; empty means the embedded
        corpus (pydoc topics and STDLIB_MODULES of the running Python, whose
        version is part of the cache name).
      options: SectionOptions.
      count_tokens: text -> token count for the budgets; None counts
        whitespace-separated words.
      count_tokens_name: required with `count_tokens`: names the tokenizer in
        the cache key, so builds with different tokenizers never share a cache.
      **kwargs: passed to tfds.
    """
    if isinstance(sources, str):
      raise TypeError(f"sources must be a sequence of paths, got the string "
                      f"{sources!r}")
    if count_tokens is not None and not count_tokens_name:
      raise ValueError("count_tokens needs count_tokens_name (it keys the cache)")
    self._count_tokens = count_tokens or whitespace_tokens
    count_name = count_tokens_name if count_tokens is not None else "words"
    key = json.dumps({"sources": list(sources), "count_tokens": count_name,
                      "options": dataclasses.asdict(options),
                      "python": "" if sources else sys.version.split()[0]},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    config = SectionsConfig(
        name=f"{'sources' if sources else 'embedded'}_{digest}",
        description=key, sources=tuple(sources), options=options,
        count_tokens_name=count_name)
    super().__init__(data_dir=data_dir, config=config, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    base = super()._info()
    # The build's counts travel with the dataset (metadata.json).
    return tfds.core.DatasetInfo(builder=self, description=base.description,
                                 features=base.features,
                                 metadata=tfds.core.MetadataDict())

  def _split_tasks(self) -> Mapping[str, Any]:
    config: SectionsConfig = self.builder_config
    splits, counts = collect(config.sources, options=config.options,
                             count_tokens=self._count_tokens)
    for name, tasks in splits.items():
      if not tasks:
        raise ValueError(f"{self.name}: split {name!r} has no tasks (counts "
                         f"{counts}); add documents or change held_out_fraction")
    self.info.metadata["counts"] = counts
    return splits

  @property
  def counts(self) -> dict[str, int]:
    """The counts (COUNT_KEYS) of the build, read back from the dataset."""
    return dict(self.info.metadata["counts"])
