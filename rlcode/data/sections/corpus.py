"""Where documents come from: local or gs:// files and directories, and the embedded corpus.

Sources are local files and directories or gs:// paths (read through
etils.epath, which uses gcsfs; a missing source, or gcsfs not installed, is a
one-line error). Directories are walked recursively in sorted order, taking
.md/.markdown/.rst/.py/.txt files; hidden files and directories
(each counted once, a directory's contents unread) and other suffixes are
skipped and counted. A document's id is "<source directory name>/<path in
it>" (a file source: its name). Files are decoded as UTF-8 (BOM allowed;
Python files by their PEP 263 coding cookie); a file that contains a NUL byte in
its first 8 KiB (binary), does not decode, or is empty or whitespace-only is
skipped and counted, never fatal. A document with a single section (no
headings, one text block) gives no task and is counted.

The embedded corpus needs no download: every topic of `pydoc_data.topics`
(79 topics, the same names in Python 3.10-3.13; split as reStructuredText,
document id `pydoc/<topic>`), the standard-library modules in
`STDLIB_MODULES` (single files in 3.11-3.13; document id `stdlib/<name>.py`),
read from `sysconfig.get_paths()["stdlib"]`, and the Markdown and
reStructuredText files at the heads of the repository bundles in
`BUNDLE_DOCS` (data/repos: attrs' and more-itertools' documentation, read
through their cached clones, rlcode.data.git.repo; hidden directories such as
.github/ left out; document id `<bundle name>/<path>`, e.g.
`attrs/docs/init.md`). The Python part is the running Python's, so counts can
change between Python releases (and rarely between patch releases); the
builder's cache name includes the Python version and the bundles' heads. With
the default SectionOptions, Python 3.11.7 gives 152 documents (120 train, 32
test) and 789 train / 125 test tasks; 3.12.1 gives 808 / 130 and 3.13.0
829 / 132 (tests/test_sections.py pins these).

This module must not split documents or make tasks beyond calling
rlcode.data.sections.tasks (`collect`).
"""

from __future__ import annotations

import collections
import io
import os
import pathlib
import posixpath
import sysconfig
import tokenize
from collections.abc import Callable, Sequence

from etils import epath

from rlcode.data.sections.splitters import Document
from rlcode.data.sections.tasks import SectionOptions, build_tasks, whitespace_tokens
from rlcode.data.tasks import Task
from rlcode.errors import MissingInput
from rlcode.remote import require_filesystem

SUFFIX_FORMATS = {".md": "markdown", ".markdown": "markdown", ".rst": "rst",
                  ".py": "python", ".txt": "text"}
# Every count a build reports (zeros included), so reports of builds compare.
COUNT_KEYS = (
    "documents", "documents_train", "documents_validation", "documents_test",
    "sections_train", "sections_validation", "sections_test", "tasks_train",
    "tasks_validation", "tasks_test", "single_section_documents",
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


PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
# Repository bundles whose documentation (Markdown, RST at the head) joins the corpus.
BUNDLE_DOCS = ("data/repos/attrs.bundle", "data/repos/more-itertools.bundle")
_DOC_FORMATS = {".md": "markdown", ".rst": "rst"}


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
  require_filesystem(source, "sections source")
  root = epath.Path(source)
  if root.is_file():
    return [(root, root.name, SUFFIX_FORMATS.get(root.suffix.lower(), "text"))]
  if not root.is_dir():
    raise MissingInput(f"sections source {source!r} is neither a file nor a directory")
  # gcsfs names the folders of a gs:// walk without their scheme ("bucket/dir"), which
  # epath would take for local paths: each folder is rebuilt under root.
  base = str(root).split("://", 1)[-1]
  found = []
  # walk, not rglob: epath refuses recursive globs (costly on GCS).
  for folder, dirnames, filenames in root.walk():
    rel = posixpath.relpath(os.fspath(folder), base)
    here = root if rel == "." else root / rel
    hidden = [d for d in dirnames if d.startswith(".")]
    stats["skipped_hidden"] += len(hidden)
    dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    for name in sorted(filenames):
      if name.startswith("."):
        stats["skipped_hidden"] += 1
        continue
      path = here / name
      fmt = SUFFIX_FORMATS.get(path.suffix.lower())
      if fmt is None:
        stats["skipped_suffix"] += 1
        continue
      found.append((path, posixpath.normpath(f"{root.name}/{rel}/{name}"), fmt))
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


def _bundle_git(bundle: str):
  from rlcode.data.git.repo import Git, checkout  # pylint: disable=import-outside-toplevel
  return Git(checkout(os.path.join(PROJECT_ROOT, bundle)))


def bundle_heads() -> dict[str, str]:
  """bundle path (BUNDLE_DOCS) -> the commit its documents are read at."""
  return {bundle: _bundle_git(bundle).resolve("HEAD") for bundle in BUNDLE_DOCS}


def bundle_documents() -> list[Document]:
  """The Markdown and RST files at the heads of BUNDLE_DOCS (module docstring)."""
  docs = []
  for bundle in BUNDLE_DOCS:
    git = _bundle_git(bundle)
    name = posixpath.basename(bundle).removesuffix(".bundle")
    files = sorted(git.tree_files(git.resolve("HEAD"), recursive=True), key=lambda f: f[2])
    with git.blobs() as blobs:
      for _, sha, path, _ in files:
        fmt = _DOC_FORMATS.get(posixpath.splitext(path)[1].lower())
        if fmt is None or any(part.startswith(".") for part in path.split("/")):
          continue
        data = blobs.read(sha)
        text, _ = decode_document(data, fmt) if data is not None else (None, "")
        if text is not None:
          docs.append(Document(f"{name}/{path}", text, fmt, f"{name}/{path}"))
  return docs


def embedded_documents() -> list[Document]:
  """The embedded corpus: pydoc topics, STDLIB_MODULES and BUNDLE_DOCS (module doc)."""
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
  return docs + bundle_documents()


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
