"""The miner: a branch's first-parent history, PR by PR, filtered into split tasks.

Each commit of a branch's first-parent history is one PR (rlcode.data.git.units
has the units a PR is cut into): a merge commit is a merged PR, its diff taken
against its first parent, its request the PR's title (the merge message
without git's or GitHub's "Merge pull request #N from ..." / "Merge branch
'...'" subject line) followed by the messages of the commits it brings in; a
non-merge commit (squash-merged or pushed directly) is a PR of its own, its
message the request. The files the PR touches (plus, optionally, untouched
files of the same directories) are the context, their post-change contents
the oracle.

Decisions worth knowing:
- One PR, one outcome: kept, or skipped for the first reason that applies, in
  the order of `SKIP_REASONS`, so kept + skipped = the commits walked. Files
  are first filtered by path (excluded globs, languages); those drops are
  counted per file in `files_excluded`, and a PR left with no file is skipped.
  A change that cannot be a text edit of existing or new files (binary,
  non-UTF-8, rename, deletion, submodule, symlink) skips the whole PR:
  dropping part of a change would make the request lie. The commits of a
  merged PR pass the same filters one by one; one that fails (or is itself a
  merge) drops only its commit unit, counted in `units_dropped` when the
  granularity is "commit".
- Added files are part of the task: their context content is "" and the prompt
  says they do not exist yet (`allow_added_files=False` skips such PRs).
- Large files are cut, not skipped: a touched file above `max_file_bytes` is
  kept as windows of `window_lines` lines around its changes
  (rlcode.data.git.excerpts; counted in `files_cut`). Above
  `hard_max_file_bytes` the PR is skipped as "file_too_large", and as
  "cut_too_large" when the windows are still above `max_file_bytes` (an added
  large file, or changes all over a file).
- The oracle always changes something the reward can see (a change of only a
  final newline or of CR/LF is invisible to SWE-RL's splitlines-based diff, so
  such files are dropped).
- Duplicates (same per-file diffs, line numbers ignored; cherry-picks,
  re-applied reverts) keep the earliest PR.
- Split by the PR's committer time (the first-parent commit's): the latest
  PRs form the test set, every test PR strictly later than every train PR (ties
  go to test), and all units of a PR go to its split. With a
  `validation_fraction`, the PRs just before the test set form a validation
  set the same way (ties with its earliest go to validation).
- A shallow clone is refused unless `allow_shallow` (its boundary commits look
  like roots adding every file, and its history is cut short).
- Tasks are held in memory until written; bound a large history with
  `max_commits`.

This module must not score completions (rlcode.rewards.diffs) nor define the
answer formats (rlcode.data.edits).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import posixpath
import re
import sys
from collections.abc import Sequence
from typing import Any

import tqdm

from rlcode.data import edits
from rlcode.data.git import filters
from rlcode.data.git.config import GRANULARITIES, MiningConfig, parse_time
from rlcode.data.git.excerpts import window
from rlcode.data.git.repo import (Blobs, Commit, Entry, Git, GitError, ShallowHistoryError,
                                  checkout)
from rlcode.data.git.units import (Change, FileChange, Pr, Skip, Tests, decompose, make_task,
                                   validate)
from rlcode.data.tasks import Task

_SUBMODULE, _SYMLINK = "160000", "120000"
_REGULAR_MODES = ("100644", "100755")
_MERGE_SUBJECT = re.compile(
    r"Merge (?:pull request #\d+ from \S+|(?:remote-tracking )?branch '[^']*'"
    r"(?: of \S+)?(?: into \S+)?)\s*")


@dataclasses.dataclass
class MiningResult:
  """The tasks of each split at the config's granularity, the build report.

  `by_granularity` holds the splits of every granularity asked of `mine`.
  """

  splits: dict[str, list[Task]]
  report: dict[str, Any]
  by_granularity: dict[str, dict[str, list[Task]]]


def pr_request(merge_message: str, messages: Sequence[str]) -> str:
  """A merged PR's request: its title (module docstring), then its commits' messages."""
  title = merge_message.strip()
  first, _, rest = title.partition("\n")
  if _MERGE_SUBJECT.fullmatch(first):
    title = rest.strip()
  parts = [title] if title else []
  for message in messages:
    message = message.strip()
    if message and message not in parts:
      parts.append(message)
  return "\n\n".join(parts)


def _message(c: Commit) -> str:
  try:
    return c.message.decode("utf-8").strip()
  except UnicodeDecodeError:
    raise Skip("non_utf8_message") from None


class _Miner:
  """Turns first-parent commits into `Pr`s, counting what it skips and why."""

  def __init__(self, git: Git, blobs: Blobs, config: MiningConfig,
               shallow: frozenset[str]):
    self.git, self.blobs, self.config, self.shallow = git, blobs, config, shallow
    self.extensions = config.extensions
    self.seen: set[str] = set()
    self._texts: dict[str, str | None] = {}

  def pr(self, c: Commit, excluded: collections.Counter) -> Pr:
    """The PR of first-parent commit `c`; raises `Skip`; counts dropped files."""
    if not c.parents and c.sha in self.shallow:
      raise Skip("shallow_boundary")
    merge = len(c.parents) > 1
    if merge:
      message = _message(c)
      brought = self.git.brought_in(c)
      request = pr_request(message, [b.message.decode("utf-8", "replace") for b in brought
                                     if len(b.parents) == 1])
    else:
      request = _message(c)
    if not request:
      raise Skip("empty_message")
    change = self.change(c, c.parents[0] if c.parents else None, request, excluded)
    key = filters.dedup_key(change.files)
    if key in self.seen:
      raise Skip("duplicate")
    self.seen.add(key)
    if not merge:
      return Pr(change, [change], merge=False)
    commits, dropped = [], collections.Counter()
    for b in brought:
      try:
        if len(b.parents) != 1:
          raise Skip("merge")
        message = _message(b)
        if not message:
          raise Skip("empty_message")
        commits.append(self.change(b, b.parents[0], message, collections.Counter()))
      except Skip as s:
        dropped[s.reason] += 1
    return Pr(change, commits, merge=True, dropped_commits=dropped)

  def change(self, c: Commit, base: str | None, request: str,
             excluded: collections.Counter) -> Change:
    """The diff of `c` against `base` as a `Change`; raises `Skip`."""
    config = self.config
    entries = self.git.changes(c.sha, base)
    if not entries:
      raise Skip("empty_change")
    kept: list[tuple[Entry, str]] = []
    for e in entries:
      try:
        paths = [p.decode("utf-8") for p in (e.path, e.old_path) if p is not None]
      except UnicodeDecodeError:
        raise Skip("non_utf8_path") from None
      reasons = [filters.path_reason(p, config, self.extensions) for p in paths]
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
    files = self._read(kept)
    generated = [f for f in files
                 if filters.is_generated(f.pre, config.generated_markers)
                 or filters.is_generated(f.post, config.generated_markers)]
    excluded["generated"] += len(generated)
    files = [f for f in files if f not in generated]
    if not files:
      raise Skip("generated")
    # Windows differ as the whole files do, so the checks below see the same
    # diff, at a fraction of the cost for a large file.
    files = [self._cut(f) for f in files]
    visible = [f for f in files if edits.normalized_patch(f.pre, f.post)]
    excluded["invisible_change"] += len(files) - len(visible)
    if not visible:
      raise Skip("no_visible_change")
    files = sorted(visible, key=lambda f: f.path)
    if sum(filters.changed_lines(f.pre, f.post) for f in files) > config.max_changed_lines:
      raise Skip("too_many_lines")
    if any(max(len(f.pre.encode()), len(f.post.encode())) > config.max_file_bytes
           for f in files):
      raise Skip("cut_too_large")
    related = self._related(base, {f.path for f in files}) if base else {}
    tests = self._tests(c.sha) if config.tests_hidden else None
    return Change(c, request, files, related, tests)

  def _read(self, kept: list[tuple[Entry, str]]) -> list[FileChange]:
    """Both sides of each kept file, checked for size, presence and text."""
    shas = [(e.old_sha, e.new_sha) for e, _ in kept]
    sizes = [self.blobs.size(s) for pair in shas for s in pair if filters.exists(s)]
    if any(size is None for size in sizes):
      raise Skip("missing_object")
    if any(size > self.config.hard_max_file_bytes for size in sizes):
      raise Skip("file_too_large")
    raw = [tuple(self.blobs.read(s) if filters.exists(s) else b"" for s in pair)
           for pair in shas]
    if any(data is None for pair in raw for data in pair):
      raise Skip("missing_object")
    if any(b"\0" in data for pair in raw for data in pair):
      raise Skip("binary")
    files = []
    for (e, path), (pre_bytes, post_bytes) in zip(kept, raw):
      pre, post = filters.decode(pre_bytes), filters.decode(post_bytes)
      if pre is None or post is None:
        raise Skip("non_utf8")
      files.append(FileChange(path, pre, post, added=e.status == "A"))
    return files

  def _cut(self, f: FileChange) -> FileChange:
    """`f`, or its windows when it is larger than max_file_bytes."""
    if max(len(f.pre.encode()), len(f.post.encode())) <= self.config.max_file_bytes:
      return f
    pre, post = window(f.pre, f.post, self.config.window_lines)
    return dataclasses.replace(f, pre=pre, post=post, cut=True)

  def _text(self, sha: str) -> str | None:
    if sha not in self._texts:
      data = self.blobs.read(sha)
      self._texts[sha] = None if data is None or b"\0" in data else filters.decode(data)
    return self._texts[sha]

  def _related(self, base: str, touched: set[str]) -> dict[str, str]:
    """Untouched text files of the touched files' directories, within budget."""
    budget = self.config.related_bytes
    out: dict[str, str] = {}
    for directory in sorted({posixpath.dirname(p) for p in touched}):
      for mode, sha, path, size in sorted(self.git.tree_files(base, directory),
                                          key=lambda t: t[2]):
        if (path in touched or mode not in _REGULAR_MODES or size > budget
            or size > self.config.max_file_bytes
            or filters.path_reason(path, self.config, self.extensions)):
          continue
        text = self._text(sha)
        if text is None or filters.is_generated(text, self.config.generated_markers):
          continue
        out[path] = text
        budget -= size
    return out

  def _tests(self, sha: str) -> Tests:
    """The test and support files of the tree of `sha` (MiningConfig.tests_*)."""
    config = self.config
    hidden, visible, support = [], [], {}
    for mode, blob, path, _ in self.git.tree_files(sha, recursive=True):
      groups = [(config.tests_hidden, hidden), (config.tests_visible, visible)]
      wanted = [out for patterns, out in groups if filters.matches_any(path, patterns)]
      is_support = filters.matches_any(path, config.tests_support)
      if mode not in _REGULAR_MODES or not (wanted or is_support):
        continue
      text = self._text(blob)
      if text is None:
        continue
      for out in wanted:
        out.append(text)
      if is_support:
        support[path] = text
    return Tests("\n".join(hidden), "\n".join(visible), support)


def _units(pr: Pr, config: MiningConfig, dropped: collections.Counter) -> dict[str, list]:
  """granularity -> [(unit, reference)] of the PR's valid units; counts the primary's drops."""
  out = {}
  for granularity in GRANULARITIES:
    valid = []
    for unit in decompose(pr, granularity):
      try:
        valid.append((unit, validate(unit, config)))
      except Skip as s:
        if granularity == config.granularity:
          dropped[s.reason] += 1
    out[granularity] = valid
  if config.granularity == "commit":
    dropped.update(pr.dropped_commits)
  return out


def mine(config: MiningConfig, revision: str | None = None, *,
         granularities: Sequence[str] = (), cache_dir: str | None = None,
         progress: bool = False) -> MiningResult:
  """Mines `config.source` into tasks split by PR time, with a report.

  The report (JSON-serialisable) holds: `commits_total` (first-parent commits
  walked, each one PR), `commits_kept`, `commits_skipped` by reason
  (`SKIP_REASONS`; kept + skipped = total), `prs` (kept PRs that are merges
  and that are single commits), `files_excluded` by reason (files dropped
  from kept PRs: "excluded_path", "language", "generated",
  "invisible_change"), `files_cut` (touched files of kept PRs cut to
  windows), `units` (valid units of every granularity over the kept PRs),
  `units_dropped` by reason at the chosen granularity (also "merge": a merge
  inside a merged branch, at "commit"), the `split` rule, its cutoff times and
  the PRs per split, `tasks` per split, and `tasks_by_granularity`.

  A PR is kept when it passes the filters and gives at least one valid unit
  at `config.granularity`.

  Args:
    config: what to mine and how.
    revision: the commit to walk from instead of `config.branch` (a builder
      passes the commit it resolved, so the data matches its cache name).
    granularities: also make the tasks of these granularities
      (`MiningResult.by_granularity`); `config.granularity` always is.
    cache_dir: where bundle clones are cached (rlcode.data.git.repo).
    progress: show a progress bar on stderr while walking.

  Raises:
    NotARepositoryError: the source is not a repository root or a bundle.
    BundleError: the bundle is corrupt.
    EmptyRepositoryError: the repository has no commits.
    UnknownBranchError: the branch does not exist.
    ShallowHistoryError: the repository is shallow and `allow_shallow` is False.
  """
  wanted = [config.granularity] + [g for g in granularities if g != config.granularity]
  for g in wanted:
    if g not in GRANULARITIES:
      raise ValueError(f"granularities: {g!r} is not one of {GRANULARITIES}")
  git = Git(checkout(config.source, cache_dir))
  head = git.resolve(revision or config.branch)
  shallow = git.shallow_commits()
  if shallow and not config.allow_shallow:
    raise ShallowHistoryError(
        f"source {config.source!r} is a shallow clone ({len(shallow)} boundary "
        "commits): its history is cut short; mine a full clone (git fetch --unshallow) "
        "or set allow_shallow")
  commits = git.first_parent_log(head, config.max_commits)
  skipped, excluded, dropped = (collections.Counter() for _ in range(3))
  units = dict.fromkeys(GRANULARITIES, 0)
  prs, files_cut = collections.Counter(), 0
  git_errors: list[str] = []
  kept: list[tuple[Commit, dict[str, list[Task]]]] = []
  with git.blobs() as blobs:
    miner = _Miner(git, blobs, config, shallow)
    for c in tqdm.tqdm(commits, desc="mining", unit="PR", file=sys.stderr,
                       disable=not progress):
      pr_excluded: collections.Counter = collections.Counter()
      try:
        pr = miner.pr(c, pr_excluded)
      except Skip as s:
        skipped[s.reason] += 1
        continue
      except GitError as e:
        skipped["git_error"] += 1
        git_errors.append(f"{c.sha}: {e}")
        continue
      pr_dropped: collections.Counter = collections.Counter()
      valid = _units(pr, config, pr_dropped)
      dropped.update(pr_dropped)
      if not valid[config.granularity]:
        skipped["oracle_not_expressible" if pr_dropped["oracle_not_expressible"]
                else "invisible_change"] += 1
        continue
      excluded.update(pr_excluded)
      for g in GRANULARITIES:
        units[g] += len(valid[g])
      prs["merge" if pr.merge else "single_commit"] += 1
      files_cut += sum(f.cut for f in pr.change.files)
      kept.append((c, {g: [make_task(pr, unit, g, reference, config)
                           for unit, reference in valid[g]] for g in wanted}))

  times = sorted(c.time for c, _ in kept)
  if config.test_after is not None:
    cutoff = parse_time(config.test_after)
  elif config.test_fraction and kept:
    cutoff = times[len(times) - math.ceil(config.test_fraction * len(times))]
  else:
    cutoff = None
  before = [t for t in times if cutoff is None or t < cutoff]
  n_validation = min(math.ceil(config.validation_fraction * len(times)), len(before))
  validation_cutoff = before[len(before) - n_validation] if n_validation else None
  names = ("train", "validation", "test") if config.validation_fraction else ("train", "test")
  by_granularity = {g: {name: [] for name in names} for g in wanted}
  prs_per_split = collections.Counter()
  for c, tasks in kept:
    if cutoff is not None and c.time >= cutoff:
      split = "test"
    elif validation_cutoff is not None and c.time >= validation_cutoff:
      split = "validation"
    else:
      split = "train"
    for g in wanted:
      by_granularity[g][split].extend(tasks[g])
    prs_per_split[split] += 1
  splits = by_granularity[config.granularity]
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
      "prs": {"merge": prs["merge"], "single_commit": prs["single_commit"]},
      "files_excluded": _counts(excluded),
      "files_cut": files_cut,
      "units": units,
      "units_dropped": _counts(dropped),
      "split": {
          "rule": "after" if config.test_after is not None else "fraction",
          "value": (config.test_after if config.test_after is not None
                    else config.test_fraction),
          "cutoff_time": cutoff,
          "validation_fraction": config.validation_fraction,
          "validation_cutoff_time": validation_cutoff,
          "train_commits": prs_per_split["train"],
          "validation_commits": prs_per_split["validation"],
          "test_commits": prs_per_split["test"],
      },
      "tasks": {name: len(tasks) for name, tasks in splits.items()},
      "tasks_by_granularity": {g: {name: len(t) for name, t in s.items()}
                               for g, s in by_granularity.items()},
      "git_errors": git_errors[:20],
  }
  return MiningResult(splits, report, by_granularity)


def _counts(counter: collections.Counter) -> dict[str, int]:
  return {k: v for k, v in sorted(counter.items()) if v}
