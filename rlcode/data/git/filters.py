"""The file-level tests the miner applies: paths, generated text, decoding, sizes, duplicates.

Path patterns (MiningConfig.exclude): "name/" excludes every path with a
directory component `name`; a pattern with another "/" matches the whole path;
any other pattern the file name. Generated files are recognised by a marker in
their first 1024 characters, case-insensitively.

This module must not read git: it judges paths and texts.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import posixpath
import re
from collections.abc import Sequence

from rlcode.data import edits
from rlcode.data.git.config import MiningConfig


def excluded_by(path: str, patterns: Sequence[str]) -> bool:
  parts = path.split("/")
  for pattern in patterns:
    if pattern.endswith("/"):
      if pattern[:-1] in parts[:-1]:
        return True
    elif "/" in pattern:
      if fnmatch.fnmatchcase(path, pattern):
        return True
    elif fnmatch.fnmatchcase(parts[-1], pattern):
      return True
  return False


def path_reason(path: str, config: MiningConfig,
                extensions: frozenset[str]) -> str | None:
  """Why `path` is dropped ("excluded_path", "language"), or None."""
  if excluded_by(path, config.exclude):
    return "excluded_path"
  if extensions and posixpath.splitext(path)[1] not in extensions:
    return "language"
  return None


def matches_any(path: str, patterns: Sequence[str]) -> bool:
  """Whether the whole `path` matches one of the fnmatch `patterns`."""
  return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def is_generated(text: str, markers: Sequence[str]) -> bool:
  head = text[:1024].lower()
  return any(m.lower() in head for m in markers)


def exists(sha: str) -> bool:
  """False for the all-zero id diff-tree gives the missing side of an add."""
  return sha.strip("0") != ""


def decode(data: bytes) -> str | None:
  """The UTF-8 text of a blob, or None."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return None


def changed_lines(old: str, new: str) -> int:
  matcher = difflib.SequenceMatcher(None, edits.split_keepends(old),
                                    edits.split_keepends(new))
  return sum((i2 - i1) + (j2 - j1)
             for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")


def dedup_key(files) -> str:
  """A hash of the per-file diffs of FileChanges, line numbers ignored."""
  h = hashlib.sha256()
  for f in sorted(files, key=lambda f: f.path):
    patch = edits.normalized_patch(f.pre, f.post)
    # Line numbers differ between a change and its cherry-pick elsewhere.
    patch = re.sub(r"^@@ [^\n]* @@", "@@", patch, flags=re.MULTILINE)
    h.update(f.path.encode() + b"\0" + patch.encode() + b"\0")
  return h.hexdigest()
