"""A history's PRs that change code and tests, and the trees their test runs need.

Each first-parent commit is one PR, as rlcode.data.git.mining has it (a merge: its diff
against its first parent, its request the PR's title and the messages of the commits it
brings in; any other commit: its own diff and message). `candidates` walks them and
sorts each into a `Candidate` (it changes at least one test path and one code path,
rlcode.swe.patches) or a skip reason ("no_test_change", "no_code_change"), reading only
the diffs. `Reader.trees` then reads what a candidate's runs need: the text files of the
base tree, and the PR's new text of every code and test path it changes (renames are a
deletion and an addition).

This module reads git (through rlcode.data.git.repo) and runs nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Iterator

from rlcode.data.git import filters
from rlcode.data.git.mining import pr_request
from rlcode.data.git.repo import Blobs, Commit, Git
from rlcode.swe import patches

_SUBMODULE, _SYMLINK = "160000", "120000"
_BLOB_CACHE = 20_000
# A file larger than this is left out of a tree (and a PR changing one is skipped): the
# tasks' workspaces are read with the same limit, so that every run sees the same files.
MAX_FILE_BYTES = 1_000_000


class Skip(Exception):
  """A PR gives no task; `reason` is one of rlcode.swe.config.SKIP_REASONS."""

  def __init__(self, reason: str, detail: str = ""):
    super().__init__(f"{reason}: {detail}" if detail else reason)
    self.reason, self.detail = reason, detail


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A PR that changes code and tests: its commit, base (first parent), request, and
  path -> (old blob or None, new blob or None, new mode) of its code and test paths."""

  commit: Commit
  base: str
  request: str
  changes: dict[str, tuple[str | None, str | None, str]]

  @property
  def sha(self) -> str:
    return self.commit.sha

  @property
  def test_paths(self) -> list[str]:
    return sorted(p for p in self.changes if patches.is_test_path(p))

  @property
  def code_paths(self) -> list[str]:
    return sorted(p for p in self.changes if patches.is_code_path(p))


@dataclasses.dataclass
class Trees:
  """What a candidate's runs are made of.

  Attributes:
    base: the base commit's text files, path -> text.
    tests_after: the PR's test paths -> their text after it (None: deleted).
    code_after: the PR's code paths -> their text after it (None: deleted).
  """

  base: dict[str, str]
  tests_after: dict[str, str | None]
  code_after: dict[str, str | None]

  @property
  def before(self) -> dict[str, str]:
    """The base with the test patch applied."""
    return _with(self.base, self.tests_after)

  @property
  def after(self) -> dict[str, str]:
    """The base with the test and code patches applied."""
    return _with(self.before, self.code_after)


def _with(tree: dict[str, str], changes: dict[str, str | None]) -> dict[str, str]:
  out = dict(tree)
  for path, text in changes.items():
    if text is None:
      out.pop(path, None)
    else:
      out[path] = text
  return out


def _decode(message: bytes) -> str:
  try:
    return message.decode("utf-8").strip()
  except UnicodeDecodeError:
    raise Skip("non_utf8_message") from None


def candidates(git: Git, commits: list[Commit]) -> Iterator[Candidate | Skip]:
  """For each commit (a PR), its Candidate or the Skip that says why it has none."""
  for c in commits:
    base = c.parents[0] if c.parents else None
    if base is None:  # a root commit adds the first files: there is no before to run
      yield Skip("root_commit")
      continue
    changes = {}
    for e in git.changes(c.sha, base, renames=False):
      try:
        path = e.path.decode("utf-8")
      except UnicodeDecodeError:
        path = e.path.decode("utf-8", "replace")
      changes[path] = (e.old_sha if filters.exists(e.old_sha) else None,
                       e.new_sha if filters.exists(e.new_sha) else None,
                       e.new_mode if filters.exists(e.new_sha) else e.old_mode)
    kept = {p: v for p, v in changes.items()
            if patches.is_test_path(p) or patches.is_code_path(p)}
    if not any(patches.is_test_path(p) for p in kept):
      yield Skip("no_test_change")
      continue
    if not any(patches.is_code_path(p) for p in kept):
      yield Skip("no_code_change")
      continue
    try:
      if len(c.parents) > 1:
        brought = [_decode(b.message) for b in git.brought_in(c) if len(b.parents) == 1]
        request = pr_request(_decode(c.message), brought)
      else:
        request = _decode(c.message)
    except Skip as s:
      yield s
      continue
    if not request:
      yield Skip("empty_message")
      continue
    yield Candidate(c, base, request, kept)


class Reader:
  """Texts of trees and blobs from one `git cat-file` process, shared by threads."""

  def __init__(self, git: Git, blobs: Blobs):
    self.git, self._blobs = git, blobs
    self._lock = threading.Lock()
    self._texts: collections.OrderedDict[str, str | None] = collections.OrderedDict()

  def text(self, sha: str) -> str | None:
    """A blob's UTF-8 text; None when it is binary, not UTF-8, too large or missing."""
    with self._lock:
      if sha in self._texts:
        self._texts.move_to_end(sha)
        return self._texts[sha]
      size = self._blobs.size(sha)
      data = (self._blobs.read(sha) if size is not None and size <= MAX_FILE_BYTES
              else None)
      text = None if data is None or b"\0" in data else filters.decode(data)
      self._texts[sha] = text
      if len(self._texts) > _BLOB_CACHE:
        self._texts.popitem(last=False)
      return text

  def tree(self, commit: str) -> dict[str, str]:
    """The commit's regular text files (symlinks, submodules and binary files left out)."""
    with self._lock:
      entries = self.git.tree_files(commit, recursive=True)
    out = {}
    for mode, sha, path, _ in entries:
      if mode == _SYMLINK:
        continue
      text = self.text(sha)
      if text is not None:
        out[path] = text
    return out

  def trees(self, c: Candidate) -> Trees:
    """The candidate's base tree and new texts; raises Skip("unusable_file") for a
    changed path that is a symlink or submodule, binary, not UTF-8 or too large."""
    after: dict[str, str | None] = {}
    for path, (old, new, mode) in c.changes.items():
      if mode in (_SYMLINK, _SUBMODULE):
        raise Skip("unusable_file", f"{path} is a symlink or submodule")
      if new is None:
        after[path] = None
        continue
      text = self.text(new)
      if text is None:
        raise Skip("unusable_file", f"{path} is binary, not UTF-8 or too large")
      after[path] = text
    base = self.tree(c.base)
    for path, (old, _, _) in c.changes.items():
      if old is not None and path not in base:
        raise Skip("unusable_file", f"{path} before the PR is binary, not UTF-8 or too large")
    tests = {p: t for p, t in after.items() if patches.is_test_path(p)}
    code = {p: t for p, t in after.items() if patches.is_code_path(p)}
    return Trees(base, tests, code)
