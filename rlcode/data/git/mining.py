"""The miner: a branch's first-parent history, filtered commit by commit, into split tasks.

Each non-merge commit of a branch's first-parent history becomes one task, or
one task per file or per hunk (`granularity`; rlcode.data.git.units): the
commit message is the request, the files the commit touches (plus, optionally,
untouched files of the same directories) are the context, and their
post-change contents are the oracle.

Decisions worth knowing:
- One commit, one outcome: kept, or skipped for the first reason that applies,
  in the order of `SKIP_REASONS`, so kept + skipped = the commits walked.
  Files are first filtered by path (excluded globs, languages); those drops are
  counted per file in `files_excluded`, and a commit left with no file is
  skipped. A change that cannot be a text edit of existing or new files
  (binary, non-UTF-8, rename, deletion, submodule, symlink) skips
  the whole commit: dropping part of a change would make the request lie.
- Added files are part of the task: their context content is "" and the prompt
  says they do not exist yet (`allow_added_files=False` skips such commits).
- The oracle always changes something the reward can see (a change of only a
  final newline or of CR/LF is invisible to SWE-RL's splitlines-based diff, so
  such files are dropped).
- Duplicates (same per-file diffs, line numbers ignored; cherry-picks,
  re-applied reverts) keep the earliest commit.
- Split by committer time: the latest commits form the test set, and every
  test commit is strictly later than every train commit (ties go to test).
- Tasks are held in memory until written; bound a large history with
  `max_commits`.

This module must not score completions (rlcode.rewards.diffs) nor define the
answer formats (rlcode.data.edits).
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import fnmatch
import hashlib
import math
import posixpath
import re
from collections.abc import Sequence
from typing import Any

from rlcode.data import edits
from rlcode.data.git.config import GRANULARITIES, MiningConfig, parse_time
from rlcode.data.git.repo import Blobs, Commit, Entry, Git, GitError, local_repository
from rlcode.data.git.units import Change, FileChange, Skip, decompose, make_task, validate
from rlcode.data.tasks import Task

_SUBMODULE, _SYMLINK = "160000", "120000"


@dataclasses.dataclass
class MiningResult:
  """The tasks of each split and the build report (JSON-serialisable)."""

  splits: dict[str, list[Task]]
  report: dict[str, Any]


# ---------------------------------------------------------------------------
# Filters.

def _excluded_by(path: str, patterns: Sequence[str]) -> bool:
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


def _path_reason(path: str, config: MiningConfig,
                 extensions: frozenset[str]) -> str | None:
  if _excluded_by(path, config.exclude):
    return "excluded_path"
  if extensions and posixpath.splitext(path)[1] not in extensions:
    return "language"
  return None


def _is_generated(text: str, markers: Sequence[str]) -> bool:
  head = text[:1024].lower()
  return any(m.lower() in head for m in markers)


def _exists(sha: str) -> bool:
  """False for the all-zero id diff-tree gives the missing side of an add."""
  return sha.strip("0") != ""


def _decode(data: bytes) -> str | None:
  """The UTF-8 text of a blob, or None."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return None


def _changed_lines(old: str, new: str) -> int:
  matcher = difflib.SequenceMatcher(None, edits.split_keepends(old),
                                    edits.split_keepends(new))
  return sum((i2 - i1) + (j2 - j1)
             for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")


def _dedup_key(files: Sequence[FileChange]) -> str:
  h = hashlib.sha256()
  for f in sorted(files, key=lambda f: f.path):
    patch = edits.normalized_patch(f.pre, f.post)
    # Line numbers differ between a change and its cherry-pick elsewhere.
    patch = re.sub(r"^@@ [^\n]* @@", "@@", patch, flags=re.MULTILINE)
    h.update(f.path.encode() + b"\0" + patch.encode() + b"\0")
  return h.hexdigest()


# ---------------------------------------------------------------------------
# The miner.

_REGULAR_MODES = ("100644", "100755")


class _Miner:
  """Turns commits into `Change`s, counting what it skips and why."""

  def __init__(self, git: Git, blobs: Blobs, config: MiningConfig,
               shallow: frozenset[str]):
    self.git, self.blobs, self.config, self.shallow = git, blobs, config, shallow
    self.extensions = config.extensions
    self.seen: set[str] = set()

  def change(self, c: Commit, excluded: collections.Counter) -> Change:
    """The commit as a `Change`; raises `Skip`; counts dropped files."""
    config = self.config
    if len(c.parents) > 1:
      raise Skip("merge")
    if not c.parents and c.sha in self.shallow:
      raise Skip("shallow_boundary")
    try:
      request = c.message.decode("utf-8").strip()
    except UnicodeDecodeError:
      raise Skip("non_utf8_message") from None
    if not request:
      raise Skip("empty_message")
    entries = self.git.changes(c.sha)
    if not entries:
      raise Skip("empty_change")
    kept: list[tuple[Entry, str]] = []
    for e in entries:
      try:
        paths = [p.decode("utf-8") for p in (e.path, e.old_path) if p is not None]
      except UnicodeDecodeError:
        raise Skip("non_utf8_path") from None
      reasons = [_path_reason(p, config, self.extensions) for p in paths]
      if all(reasons):
        excluded[reasons[0]] += 1
      else:
        kept.append((e, paths[0]))
    if not kept:
      raise Skip("all_files_filtered")
    checks = (
        ("submodule", lambda e: _SUBMODULE in (e.old_mode, e.new_mode)),
        ("symlink", lambda e: _SYMLINK in (e.old_mode, e.new_mode)),
        ("rename", lambda e: e.status == "R"),
        ("deletion", lambda e: e.status == "D"),
        ("added_file", lambda e: e.status == "A" and not config.allow_added_files),
    )
    for reason, applies in checks:
      if any(applies(e) for e, _ in kept):
        raise Skip(reason)
    if len(kept) > config.max_files:
      raise Skip("too_many_files")
    shas = [(e.old_sha, e.new_sha) for e, _ in kept]
    sizes = [self.blobs.size(s) for pair in shas for s in pair if _exists(s)]
    if any(size is None for size in sizes):
      raise Skip("missing_object")
    if any(size > config.max_file_bytes for size in sizes):
      raise Skip("file_too_large")
    raw = [tuple(self.blobs.read(s) if _exists(s) else b"" for s in pair)
           for pair in shas]
    if any(data is None for pair in raw for data in pair):
      raise Skip("missing_object")
    if any(b"\0" in data for pair in raw for data in pair):
      raise Skip("binary")
    files = []
    for (e, path), (pre_bytes, post_bytes) in zip(kept, raw):
      pre, post = _decode(pre_bytes), _decode(post_bytes)
      if pre is None or post is None:
        raise Skip("non_utf8")
      files.append(FileChange(path, pre, post, added=e.status == "A"))
    generated = [f for f in files
                 if _is_generated(f.pre, config.generated_markers)
                 or _is_generated(f.post, config.generated_markers)]
    excluded["generated"] += len(generated)
    files = [f for f in files if f not in generated]
    if not files:
      raise Skip("generated")
    visible = [f for f in files if edits.normalized_patch(f.pre, f.post)]
    excluded["invisible_change"] += len(files) - len(visible)
    if not visible:
      raise Skip("no_visible_change")
    files = sorted(visible, key=lambda f: f.path)
    if sum(_changed_lines(f.pre, f.post) for f in files) > config.max_changed_lines:
      raise Skip("too_many_lines")
    key = _dedup_key(files)
    if key in self.seen:
      raise Skip("duplicate")
    self.seen.add(key)
    related = self._related(c, {f.path for f in files}) if c.parents else {}
    return Change(c, request, files, related)

  def _related(self, c: Commit, touched: set[str]) -> dict[str, str]:
    """Untouched text files of the touched files' directories, within budget."""
    budget = self.config.related_bytes
    out: dict[str, str] = {}
    for directory in sorted({posixpath.dirname(p) for p in touched}):
      for mode, sha, path, size in sorted(
          self.git.tree_files(c.parents[0], directory), key=lambda t: t[2]):
        if (path in touched or mode not in _REGULAR_MODES or size > budget
            or size > self.config.max_file_bytes
            or _path_reason(path, self.config, self.extensions)):
          continue
        data = self.blobs.read(sha)
        if data is None or b"\0" in data:
          continue
        text = _decode(data)
        if text is None or _is_generated(text, self.config.generated_markers):
          continue
        out[path] = text
        budget -= size
    return out


def mine(config: MiningConfig, revision: str | None = None) -> MiningResult:
  """Mines `config.source` into tasks split by commit time, with a report.

  The report (JSON-serialisable) holds: `commits_total` walked,
  `commits_kept`, `commits_skipped` by reason (`SKIP_REASONS`; kept + skipped
  = total), `files_excluded` by reason (files dropped from kept commits:
  "excluded_path", "language", "generated", "invisible_change"), `units`
  (valid tasks each granularity gives over the commits that pass the
  commit-level filters), `units_dropped` by reason at the chosen granularity,
  the `split` rule and its cutoff time, and `tasks` per split.

  Args:
    config: what to mine and how.
    revision: the commit to walk from instead of `config.branch` (a builder
      passes the commit it resolved, so the data matches its cache name).

  Raises:
    NotARepositoryError: the source is not a repository root or a bundle.
    EmptyRepositoryError: the repository has no commits.
    ValueError: the branch does not exist.
  """
  with local_repository(config.source) as path:
    git = Git(path)
    head = git.resolve(revision or config.branch)
    shallow = git.shallow_commits()
    commits = git.first_parent_log(head, config.max_commits)
    skipped: collections.Counter = collections.Counter()
    excluded: collections.Counter = collections.Counter()
    dropped: collections.Counter = collections.Counter()
    units_per_granularity = dict.fromkeys(GRANULARITIES, 0)
    git_errors: list[str] = []
    kept: list[tuple[Commit, list[Task]]] = []
    with git.blobs() as blobs:
      miner = _Miner(git, blobs, config, shallow)
      for c in commits:
        commit_excluded: collections.Counter = collections.Counter()
        try:
          change = miner.change(c, commit_excluded)
        except Skip as s:
          skipped[s.reason] += 1
          continue
        except GitError as e:
          skipped["git_error"] += 1
          git_errors.append(f"{c.sha}: {e}")
          continue
        tasks, commit_dropped = [], collections.Counter()
        for granularity in GRANULARITIES:
          for unit in decompose(change, granularity):
            try:
              reference = validate(unit, config.edit_format)
            except Skip as s:
              if granularity == config.granularity:
                commit_dropped[s.reason] += 1
              continue
            units_per_granularity[granularity] += 1
            if granularity == config.granularity:
              tasks.append(make_task(change, unit, granularity, reference, config))
        dropped.update(commit_dropped)
        if not tasks:
          skipped[("oracle_not_expressible"
                   if commit_dropped["oracle_not_expressible"]
                   else "invisible_change")] += 1
          continue
        excluded.update(commit_excluded)
        kept.append((c, tasks))

  if config.test_after is not None:
    cutoff = parse_time(config.test_after)
  elif config.test_fraction and kept:
    times = sorted(c.time for c, _ in kept)
    cutoff = times[len(times) - math.ceil(config.test_fraction * len(times))]
  else:
    cutoff = None
  splits: dict[str, list[Task]] = {"train": [], "test": []}
  commits_per_split = collections.Counter()
  for c, tasks in kept:
    split = "test" if cutoff is not None and c.time >= cutoff else "train"
    splits[split].extend(tasks)
    commits_per_split[split] += 1
  report = {
      "source": config.source,
      "branch": config.branch,
      "head": head,
      "shallow": bool(shallow),
      "granularity": config.granularity,
      "edit_format": config.edit_format,
      "commits_total": len(commits),
      "commits_kept": len(kept),
      "commits_skipped": _counts(skipped),
      "files_excluded": _counts(excluded),
      "units": units_per_granularity,
      "units_dropped": _counts(dropped),
      "split": {
          "rule": "after" if config.test_after is not None else "fraction",
          "value": (config.test_after if config.test_after is not None
                    else config.test_fraction),
          "cutoff_time": cutoff,
          "train_commits": commits_per_split["train"],
          "test_commits": commits_per_split["test"],
      },
      "tasks": {name: len(tasks) for name, tasks in splits.items()},
      "git_errors": git_errors[:20],
  }
  return MiningResult(splits, report)


def _counts(counter: collections.Counter) -> dict[str, int]:
  return {k: v for k, v in sorted(counter.items()) if v}

