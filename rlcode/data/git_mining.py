"""Mining a git history into diff tasks, and the tfds builder that stores them.

Each non-merge commit of a branch's first-parent history becomes one task, or
one task per file or per hunk (`granularity`): the commit message is the
request, the files the commit touches (plus, optionally, untouched files of the
same directories) are the context, and their post-change contents are the
oracle. Everything goes through the git CLI (`git log`, `git diff-tree`,
`git cat-file --batch-command`, `git ls-tree`); nothing here parses git objects.

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
  such files are dropped), and is always expressible in the task's edit format:
  the reference answer is rendered and applied back while mining, and a unit
  whose answer does not reproduce the oracle is dropped: a "=======" line can
  cut a SEARCH/REPLACE block short, and text containing <think> or <solution>
  breaks the one-tag-each rule of every answer.
- Decomposition: a file task of a commit touching A and B shows B already in
  its post-change state, A in its pre-change state, and the part already made
  as a unified diff in the prompt; a hunk task does the same with the other
  hunks of its file applied too. The oracle is the unit's file after the
  commit, so every unit's oracle applied to its context gives the commit's
  post-change files.
- Duplicates (same per-file diffs, line numbers ignored; cherry-picks,
  re-applied reverts) keep the earliest commit.
- Excerpts (`context_lines` > 0): whole files make byte-level prompts far
  longer than a small model's context, so a task may show only the lines
  near the changes it asks for: the files its oracle changes, each cut to the
  lines within `context_lines` of a changed line (every other run of lines
  becomes one marker line "[... lines A-B not shown ...]"), without the files
  it leaves alone and without the part of the commit already made. This
  tells the policy where to edit. `extra["files"]` stays whole, so the reward
  applies answers to the whole files; a reference SEARCH text that reaches
  beyond the excerpt (made longer to be unique) widens that task's window
  until it is shown.
- Split by committer time: the latest commits form the test set, and every
  test commit is strictly later than every train commit (ties go to test).
- Tasks are held in memory until written; bound a large history with
  `max_commits`.

This module must not score completions (rlcode.rewards.diffs) nor define the
answer formats (rlcode.data.edits).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import difflib
import fnmatch
import hashlib
import json
import math
import os
import posixpath
import re
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import tensorflow_datasets as tfds
from etils import epath

from rlcode.data import edits
from rlcode.data.tasks import Task, TaskBuilder

GRANULARITIES = ("commit", "file", "hunk")

# In the order they are checked; a skipped commit counts under the first.
SKIP_REASONS = (
    "merge", "shallow_boundary", "non_utf8_message", "empty_message",
    "empty_change", "non_utf8_path", "all_files_filtered", "submodule",
    "symlink", "rename", "deletion", "added_file",
    "too_many_files", "missing_object", "file_too_large", "binary", "non_utf8",
    "generated", "no_visible_change", "too_many_lines", "duplicate",
    "invisible_change", "oracle_not_expressible", "git_error",
)

LANGUAGES = {
    "python": (".py", ".pyi"),
    "javascript": (".js", ".jsx", ".mjs", ".cjs"),
    "typescript": (".ts", ".tsx"),
    "go": (".go",),
    "rust": (".rs",),
    "java": (".java",),
    "kotlin": (".kt", ".kts"),
    "c": (".c", ".h"),
    "cpp": (".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx"),
    "ruby": (".rb",),
    "shell": (".sh", ".bash"),
    "markdown": (".md",),
    "rst": (".rst",),
    "yaml": (".yaml", ".yml"),
    "toml": (".toml",),
    "json": (".json",),
}

# "name/" excludes every path with a directory component `name`; a pattern
# with another "/" matches the whole path; any other pattern the file name.
DEFAULT_EXCLUDE = (
    "vendor/", "vendored/", "_vendor/", "third_party/", "third-party/",
    "node_modules/", "bower_components/", "*.min.js", "*.min.css", "*.lock",
    "package-lock.json", "pnpm-lock.yaml", "go.sum", "*_pb2.py",
    "*_pb2_grpc.py", "*.pb.go",
)
# Looked for, case-insensitively, in the first 1024 characters of a file.
DEFAULT_GENERATED_MARKERS = (
    "@generated", "do not edit", "code generated by", "autogenerated",
    "auto-generated",
)

_SUBMODULE, _SYMLINK = "160000", "120000"


class NotARepositoryError(ValueError):
  """The source is not a git repository (or bundle), or not its root."""


class EmptyRepositoryError(ValueError):
  """The repository has no commit at all."""


class GitError(RuntimeError):
  """A git command failed; the message has the command and git's stderr."""


@dataclasses.dataclass(frozen=True)
class MiningConfig:
  """Everything that decides which tasks a history yields.

  Attributes:
    source: a local repository (its root or, for a bare one, its git dir), or
      a git bundle file, local or remote (`gs://...`, read through epath).
    branch: the branch, tag or commit whose first-parent history is walked.
    granularity: "commit", "file" or "hunk": the unit of one task.
    edit_format: "search_replace" or "unified_diff": the answer format the
      prompt asks for and the reward parses.
    max_commits: walk only the latest this many first-parent commits; 0: all.
    max_files: skip commits touching more files (after path filters).
    max_changed_lines: skip commits adding + removing more lines.
    max_file_bytes: skip commits with a touched file larger than this, before
      or after; related files larger than this are not added.
    languages: keep only files of these languages (names in `LANGUAGES`) or
      extensions (".py"); empty keeps every text file.
    exclude: path patterns of vendored, generated or lock files (see
      `DEFAULT_EXCLUDE` for the syntax).
    generated_markers: files whose start contains one are dropped.
    allow_added_files: False skips commits that add files.
    related_bytes: budget of untouched same-directory files added to each
      task's context, in bytes of text; 0 adds none.
    context_lines: 0 shows the task's files whole in the prompt; N >= 3 shows
      excerpts: the lines within N lines of a change (see the module
      docstring).
    test_fraction: the latest fraction of kept commits that form the test
      split (commits at the boundary time all go to test).
    test_after: instead of a fraction, commits at or after this time (ISO 8601,
      UTC when no zone is given, or Unix seconds) form the test split.
      Exactly one of `test_fraction` and `test_after` must be given.
  """

  source: str
  branch: str = "HEAD"
  granularity: str = "commit"
  edit_format: str = "search_replace"
  max_commits: int = 0
  max_files: int = 8
  max_changed_lines: int = 400
  max_file_bytes: int = 64_000
  languages: tuple[str, ...] = ()
  exclude: tuple[str, ...] = DEFAULT_EXCLUDE
  generated_markers: tuple[str, ...] = DEFAULT_GENERATED_MARKERS
  allow_added_files: bool = True
  related_bytes: int = 0
  context_lines: int = 0
  test_fraction: float | None = 0.1
  test_after: str | None = None

  def __post_init__(self):
    for name in ("languages", "exclude", "generated_markers"):
      value = getattr(self, name)
      if isinstance(value, str):
        raise ValueError(f"MiningConfig.{name} must be a sequence of strings, "
                         f"got the string {value!r}")
      object.__setattr__(self, name, tuple(value))
    if not self.source:
      raise ValueError("MiningConfig.source is empty")
    if self.granularity not in GRANULARITIES:
      raise ValueError(f"MiningConfig.granularity={self.granularity!r}; "
                       f"expected one of {GRANULARITIES}")
    if self.edit_format not in edits.EDIT_FORMATS:
      raise ValueError(f"MiningConfig.edit_format={self.edit_format!r}; "
                       f"expected one of {edits.EDIT_FORMATS}")
    for name in ("max_commits", "related_bytes"):
      if getattr(self, name) < 0:
        raise ValueError(f"MiningConfig.{name}={getattr(self, name)} < 0")
    if self.context_lines < 0 or 0 < self.context_lines < 3:
      # Fewer than the 3 context lines of a unified-diff hunk would hide
      # lines the answer must quote.
      raise ValueError(f"MiningConfig.context_lines={self.context_lines}; "
                       "expected 0 (whole files) or at least 3")
    for name in ("max_files", "max_changed_lines", "max_file_bytes"):
      if getattr(self, name) < 1:
        raise ValueError(f"MiningConfig.{name}={getattr(self, name)} < 1")
    for lang in self.languages:
      if not lang.startswith(".") and lang not in LANGUAGES:
        raise ValueError(f"MiningConfig.languages: unknown language {lang!r}; "
                         f"known: {sorted(LANGUAGES)} or an extension '.xyz'")
    if (self.test_fraction is None) == (self.test_after is None):
      raise ValueError("MiningConfig: give exactly one of test_fraction and "
                       f"test_after (got {self.test_fraction!r} and "
                       f"{self.test_after!r})")
    if self.test_fraction is not None and not 0 <= self.test_fraction < 1:
      raise ValueError(f"MiningConfig.test_fraction={self.test_fraction} is not "
                       "in [0, 1)")
    if self.test_after is not None:
      _parse_time(self.test_after)

  @property
  def extensions(self) -> frozenset[str]:
    out = set()
    for lang in self.languages:
      out.update((lang,) if lang.startswith(".") else LANGUAGES[lang])
    return frozenset(out)


def _parse_time(value: str) -> int:
  if re.fullmatch(r"-?\d+", value.strip()):
    return int(value)
  try:
    t = datetime.datetime.fromisoformat(value)
  except ValueError as e:
    raise ValueError(f"MiningConfig.test_after={value!r} is neither Unix "
                     "seconds nor an ISO 8601 time") from e
  if t.tzinfo is None:
    t = t.replace(tzinfo=datetime.timezone.utc)
  return int(t.timestamp())


@dataclasses.dataclass
class MiningResult:
  """The tasks of each split and the build report (JSON-serialisable)."""

  splits: dict[str, list[Task]]
  report: dict[str, Any]


# ---------------------------------------------------------------------------
# git through its CLI.

def _is_bundle(source: str) -> bool:
  return "://" in source or os.path.isfile(source)


@contextlib.contextmanager
def _local_repository(source: str) -> Iterator[str]:
  """A local repository path for `source`, cloning a bundle into a temp dir."""
  if not _is_bundle(source):
    yield source
    return
  with tempfile.TemporaryDirectory(prefix="rlcode-bundle-") as tmp:
    bundle = source
    if "://" in source:
      bundle = os.path.join(tmp, "source.bundle")
      epath.Path(source).copy(bundle)
    target = os.path.join(tmp, "repo.git")
    r = subprocess.run(["git", "clone", "--bare", "--quiet", bundle, target],
                       capture_output=True, env=_git_env(), check=False)
    if r.returncode:
      raise NotARepositoryError(
          f"source {source!r} is a file but not a git bundle git can clone: "
          f"{r.stderr.decode(errors='replace').strip()}")
    yield target


def _git_env() -> dict[str, str]:
  # A GIT_DIR or GIT_INDEX_FILE inherited from a hook would redirect every
  # command to another repository.
  env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
  env["GIT_TERMINAL_PROMPT"] = "0"
  return env


class _Git:
  """Runs git commands against one repository."""

  def __init__(self, path: str):
    if not os.path.exists(path):
      raise NotARepositoryError(f"source {path!r} does not exist")
    self._env = _git_env()
    r = self._run_raw(["-C", path, "rev-parse", "--absolute-git-dir"])
    if r.returncode:
      raise NotARepositoryError(
          f"source {path!r} is not a git repository: "
          f"{r.stderr.decode(errors='replace').strip()}")
    self.git_dir = r.stdout.decode().strip()
    # A bare repository has no top level; its root is its git dir.
    r = self._run_raw(["-C", path, "rev-parse", "--show-toplevel"])
    root = r.stdout.decode().strip() if r.returncode == 0 else self.git_dir
    if os.path.realpath(path) not in {os.path.realpath(root),
                                      os.path.realpath(self.git_dir)}:
      raise NotARepositoryError(
          f"source {path!r} is inside the repository {root!r} but is not its "
          "root; pass the root")

  def _run_raw(self, args: Sequence[str]):
    return subprocess.run(["git", *args], capture_output=True, env=self._env,
                          check=False)

  def run(self, *args: str) -> bytes:
    r = self._run_raw([f"--git-dir={self.git_dir}", *args])
    if r.returncode:
      raise GitError(f"git {' '.join(args)} failed ({r.returncode}): "
                     f"{r.stderr.decode(errors='replace').strip()}")
    return r.stdout

  def resolve(self, revision: str) -> str:
    r = self._run_raw([f"--git-dir={self.git_dir}", "rev-parse", "--verify",
                       "--quiet", "--end-of-options", revision + "^{commit}"])
    if r.returncode == 0:
      return r.stdout.decode().strip()
    if not self.run("rev-list", "-n", "1", "--all").strip():
      raise EmptyRepositoryError(f"repository {self.git_dir!r} has no commits")
    raise ValueError(f"branch {revision!r} is not a commit of {self.git_dir!r}")

  def shallow_commits(self) -> frozenset[str]:
    if self.run("rev-parse", "--is-shallow-repository").strip() != b"true":
      return frozenset()
    path = self.run("rev-parse", "--git-path", "shallow").decode().strip()
    with open(os.path.abspath(path)) as f:
      return frozenset(line.strip() for line in f if line.strip())

  def first_parent_log(self, head: str, max_commits: int) -> list[_Commit]:
    """First-parent history of `head`, oldest first."""
    args = ["log", "--first-parent", "-z", "--no-show-signature",
            "--format=%H%x1f%P%x1f%ct%x1f%B"]
    if max_commits:
      args += ["-n", str(max_commits)]
    out = self.run(*args, head, "--")
    commits = []
    for record in out.split(b"\0"):
      if not record.strip():
        continue
      fields = record.split(b"\x1f", 3)
      # 40 hex digits, or 64 in a SHA-256 repository.
      if len(fields) != 4 or not re.fullmatch(
          rb"\n?[0-9a-f]{40}(?:[0-9a-f]{24})?", fields[0]):
        raise GitError(f"unexpected git log record {record[:100]!r}")
      commits.append(_Commit(
          sha=fields[0].strip().decode(),
          parents=tuple(fields[1].decode().split()),
          time=int(fields[2]), message=fields[3]))
    return commits[::-1]

  def changes(self, sha: str) -> list[_Entry]:
    out = self.run("diff-tree", "-r", "-z", "--no-commit-id", "--raw", "-M",
                   "--root", "--no-ext-diff", sha)
    tokens = out.split(b"\0")
    entries, i = [], 0
    while i < len(tokens):
      token = tokens[i]
      i += 1
      if not token:
        continue
      if not token.startswith(b":"):
        raise GitError(f"unexpected git diff-tree output {token[:100]!r}")
      old_mode, new_mode, old_sha, new_sha, status = token[1:].decode().split()
      # -M without -C: added, modified, deleted, renamed or type-changed.
      if status[0] not in "AMDRT":
        raise GitError(f"unexpected git diff-tree status {status!r}")
      if status[0] == "R":
        old_path, path = tokens[i], tokens[i + 1]
        i += 2
      else:
        old_path, path = None, tokens[i]
        i += 1
      entries.append(_Entry(status[0], old_mode, new_mode, old_sha, new_sha,
                            path, old_path))
    return entries

  def tree_files(self, commit: str,
                 directory: str) -> list[tuple[str, str, str, int]]:
    """(mode, sha, path, size) of the blobs directly in `directory`."""
    args = ["ls-tree", "-z", "-l", "--full-tree", commit]
    if directory:
      args += ["--", directory + "/"]
    out = []
    for token in self.run(*args).split(b"\0"):
      if not token:
        continue
      meta, raw_path = token.split(b"\t", 1)
      mode, kind, sha, size = meta.decode().split()
      if kind != "blob":
        continue
      try:
        path = raw_path.decode("utf-8")
      except UnicodeDecodeError:
        continue
      out.append((mode, sha, path, int(size)))
    return out

  @contextlib.contextmanager
  def blobs(self) -> Iterator[_Blobs]:
    proc = subprocess.Popen(
        ["git", f"--git-dir={self.git_dir}", "cat-file", "--batch-command"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=self._env)
    try:
      yield _Blobs(proc)
    finally:
      proc.stdin.close()
      proc.stdout.close()
      proc.wait()
      proc.stderr.close()


class _Blobs:
  """Sizes and contents of blobs from one `git cat-file --batch-command`."""

  def __init__(self, proc: subprocess.Popen):
    self._proc = proc

  def _ask(self, command: str, sha: str) -> tuple[bool, int]:
    self._proc.stdin.write(f"{command} {sha}\n".encode())
    self._proc.stdin.flush()
    header = self._proc.stdout.readline()
    if not header:
      raise GitError("git cat-file --batch-command exited: "
                     f"{self._proc.stderr.read().decode(errors='replace')}")
    parts = header.split()
    if parts[-1] == b"missing":
      return False, 0
    return True, int(parts[2])

  def size(self, sha: str) -> int | None:
    found, size = self._ask("info", sha)
    return size if found else None

  def read(self, sha: str) -> bytes | None:
    found, size = self._ask("contents", sha)
    if not found:
      return None
    data = self._proc.stdout.read(size)
    self._proc.stdout.read(1)  # the newline after the contents
    return data


@dataclasses.dataclass(frozen=True)
class _Commit:
  sha: str
  parents: tuple[str, ...]
  time: int
  message: bytes


@dataclasses.dataclass(frozen=True)
class _Entry:
  status: str
  old_mode: str
  new_mode: str
  old_sha: str
  new_sha: str
  path: bytes
  old_path: bytes | None


@dataclasses.dataclass(frozen=True)
class _FileChange:
  path: str
  pre: str
  post: str
  added: bool


@dataclasses.dataclass
class _Change:
  """A commit that passed every commit-level filter."""

  commit: _Commit
  request: str
  files: list[_FileChange]
  related: dict[str, str]


class _Skip(Exception):

  def __init__(self, reason: str):
    super().__init__(reason)
    self.reason = reason


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


def _dedup_key(files: Sequence[_FileChange]) -> str:
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
  """Turns commits into `_Change`s, counting what it skips and why."""

  def __init__(self, git: _Git, blobs: _Blobs, config: MiningConfig,
               shallow: frozenset[str]):
    self.git, self.blobs, self.config, self.shallow = git, blobs, config, shallow
    self.extensions = config.extensions
    self.seen: set[str] = set()

  def change(self, c: _Commit, excluded: collections.Counter) -> _Change:
    """The commit as a `_Change`; raises `_Skip`; counts dropped files."""
    config = self.config
    if len(c.parents) > 1:
      raise _Skip("merge")
    if not c.parents and c.sha in self.shallow:
      raise _Skip("shallow_boundary")
    try:
      request = c.message.decode("utf-8").strip()
    except UnicodeDecodeError:
      raise _Skip("non_utf8_message") from None
    if not request:
      raise _Skip("empty_message")
    entries = self.git.changes(c.sha)
    if not entries:
      raise _Skip("empty_change")
    kept: list[tuple[_Entry, str]] = []
    for e in entries:
      try:
        paths = [p.decode("utf-8") for p in (e.path, e.old_path) if p is not None]
      except UnicodeDecodeError:
        raise _Skip("non_utf8_path") from None
      reasons = [_path_reason(p, config, self.extensions) for p in paths]
      if all(reasons):
        excluded[reasons[0]] += 1
      else:
        kept.append((e, paths[0]))
    if not kept:
      raise _Skip("all_files_filtered")
    checks = (
        ("submodule", lambda e: _SUBMODULE in (e.old_mode, e.new_mode)),
        ("symlink", lambda e: _SYMLINK in (e.old_mode, e.new_mode)),
        ("rename", lambda e: e.status == "R"),
        ("deletion", lambda e: e.status == "D"),
        ("added_file", lambda e: e.status == "A" and not config.allow_added_files),
    )
    for reason, applies in checks:
      if any(applies(e) for e, _ in kept):
        raise _Skip(reason)
    if len(kept) > config.max_files:
      raise _Skip("too_many_files")
    shas = [(e.old_sha, e.new_sha) for e, _ in kept]
    sizes = [self.blobs.size(s) for pair in shas for s in pair if _exists(s)]
    if any(size is None for size in sizes):
      raise _Skip("missing_object")
    if any(size > config.max_file_bytes for size in sizes):
      raise _Skip("file_too_large")
    raw = [tuple(self.blobs.read(s) if _exists(s) else b"" for s in pair)
           for pair in shas]
    if any(data is None for pair in raw for data in pair):
      raise _Skip("missing_object")
    if any(b"\0" in data for pair in raw for data in pair):
      raise _Skip("binary")
    files = []
    for (e, path), (pre_bytes, post_bytes) in zip(kept, raw):
      pre, post = _decode(pre_bytes), _decode(post_bytes)
      if pre is None or post is None:
        raise _Skip("non_utf8")
      files.append(_FileChange(path, pre, post, added=e.status == "A"))
    generated = [f for f in files
                 if _is_generated(f.pre, config.generated_markers)
                 or _is_generated(f.post, config.generated_markers)]
    excluded["generated"] += len(generated)
    files = [f for f in files if f not in generated]
    if not files:
      raise _Skip("generated")
    visible = [f for f in files if edits.normalized_patch(f.pre, f.post)]
    excluded["invisible_change"] += len(files) - len(visible)
    if not visible:
      raise _Skip("no_visible_change")
    files = sorted(visible, key=lambda f: f.path)
    if sum(_changed_lines(f.pre, f.post) for f in files) > config.max_changed_lines:
      raise _Skip("too_many_lines")
    key = _dedup_key(files)
    if key in self.seen:
      raise _Skip("duplicate")
    self.seen.add(key)
    related = self._related(c, {f.path for f in files}) if c.parents else {}
    return _Change(c, request, files, related)

  def _related(self, c: _Commit, touched: set[str]) -> dict[str, str]:
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


@dataclasses.dataclass(frozen=True)
class _Unit:
  id: str
  files: dict[str, str]
  oracle: dict[str, str]
  new_files: tuple[str, ...]
  applied_diff: str


def _units(change: _Change, granularity: str) -> list[_Unit]:
  """The tasks of one change at `granularity`, before validation."""
  sha = change.commit.sha
  pre = {**change.related, **{f.path: f.pre for f in change.files}}
  post = {f.path: f.post for f in change.files}
  added = {f.path for f in change.files if f.added}
  if granularity == "commit":
    return [_Unit(sha, pre, post, tuple(sorted(added)), "")]
  units = []
  for f in change.files:
    if granularity == "file":
      starts = [(f"{sha}:{f.path}", f.pre)]
    else:
      a, b, hunks = edits.line_hunks(f.pre, f.post)
      # Hunk k's context: the file after the commit with hunk k undone.
      starts = [(f"{sha}:{f.path}#{k}", "".join(b[:j1] + a[i1:i2] + b[j2:]))
                for k, (i1, i2, j1, j2) in enumerate(hunks, 1)]
    for unit_id, start in starts:
      files = {**pre, **post, f.path: start}
      new = (f.path,) if f.added and not start else ()
      units.append(_Unit(unit_id, files, {f.path: f.post}, new,
                         edits.unified_diff_text(pre, files)))
  return units


def _validate(unit: _Unit, edit_format: str) -> str:
  """The unit's reference completion; raises _Skip when it is unusable."""
  for path, content in unit.oracle.items():
    if not edits.normalized_patch(unit.files[path], content):
      raise _Skip("invisible_change")
  try:
    return edits.oracle_completion(unit.files, unit.oracle, edit_format)
  except ValueError:
    raise _Skip("oracle_not_expressible") from None


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
  with _local_repository(config.source) as path:
    git = _Git(path)
    head = git.resolve(revision or config.branch)
    shallow = git.shallow_commits()
    commits = git.first_parent_log(head, config.max_commits)
    skipped: collections.Counter = collections.Counter()
    excluded: collections.Counter = collections.Counter()
    dropped: collections.Counter = collections.Counter()
    units_per_granularity = dict.fromkeys(GRANULARITIES, 0)
    git_errors: list[str] = []
    kept: list[tuple[_Commit, list[Task]]] = []
    with git.blobs() as blobs:
      miner = _Miner(git, blobs, config, shallow)
      for c in commits:
        commit_excluded: collections.Counter = collections.Counter()
        try:
          change = miner.change(c, commit_excluded)
        except _Skip as s:
          skipped[s.reason] += 1
          continue
        except GitError as e:
          skipped["git_error"] += 1
          git_errors.append(f"{c.sha}: {e}")
          continue
        tasks, commit_dropped = [], collections.Counter()
        for granularity in GRANULARITIES:
          for unit in _units(change, granularity):
            try:
              reference = _validate(unit, config.edit_format)
            except _Skip as s:
              if granularity == config.granularity:
                commit_dropped[s.reason] += 1
              continue
            units_per_granularity[granularity] += 1
            if granularity == config.granularity:
              tasks.append(_task(change, unit, granularity, reference, config))
        dropped.update(commit_dropped)
        if not tasks:
          skipped[("oracle_not_expressible"
                   if commit_dropped["oracle_not_expressible"]
                   else "invisible_change")] += 1
          continue
        excluded.update(commit_excluded)
        kept.append((c, tasks))

  if config.test_after is not None:
    cutoff = _parse_time(config.test_after)
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


def _excerpt(old: str, new: str, context_lines: int) -> str:
  """`old` with only the lines within `context_lines` of a change to `new`."""
  a = edits.split_keepends(old)
  shown = [False] * len(a)
  matcher = difflib.SequenceMatcher(None, a, edits.split_keepends(new))
  for tag, i1, i2, _, _ in matcher.get_opcodes():
    if tag != "equal":
      lo, hi = max(i1 - context_lines, 0), min(i2 + context_lines, len(a))
      shown[lo:hi] = [True] * (hi - lo)
  out, k = [], 0
  while k < len(a):
    end = k
    while end < len(a) and shown[end] == shown[k]:
      end += 1
    # A marker is no shorter than one line it would replace.
    if shown[k] or end - k == 1:
      out.extend(a[k:end])
    else:
      out.append(f"[... lines {k + 1}-{end} not shown ...]\n")
    k = end
  return "".join(out)


def _excerpts(unit: _Unit, reference: str,
              config: MiningConfig) -> dict[str, str]:
  """The unit's changed files cut to `context_lines` around each change.

  A search_replace reference must apply to what is shown; where its SEARCH
  text reaches further, the window doubles (at worst to the whole file).
  """
  n = config.context_lines
  while True:
    shown = {p: _excerpt(unit.files.get(p, ""), unit.oracle[p], n)
             for p in sorted(unit.oracle)}
    if config.edit_format != "search_replace":
      return shown
    try:
      edits.apply_completion(reference, shown, config.edit_format)
      return shown
    except edits.FormatError:
      n *= 2


def _task(change: _Change, unit: _Unit, granularity: str, reference: str,
          config: MiningConfig) -> Task:
  shown, applied_diff = unit.files, unit.applied_diff
  if config.context_lines:
    shown, applied_diff = _excerpts(unit, reference, config), ""
  return Task(
      id=unit.id,
      prompt=edits.build_prompt(change.request, shown, config.edit_format,
                                unit.new_files, applied_diff),
      kind="diff",
      reference=reference,
      extra={
          "files": unit.files,
          "oracle": unit.oracle,
          "edit_format": config.edit_format,
          "new_files": list(unit.new_files),
          "commit": change.commit.sha,
          "time": change.commit.time,
          "unit": granularity,
      })


# ---------------------------------------------------------------------------
# The tfds builder.

REPORT_NAME = "build_report.json"


@dataclasses.dataclass(eq=False)
class GitDiffsConfig(tfds.core.BuilderConfig):
  """A `MiningConfig` as a tfds config; the name hashes every argument.

  For a local repository the branch is resolved to its commit, and that commit
  is part of the hash too: new commits on the branch make a new dataset rather
  than reuse a stale one. A bundle is not opened to name it; pin `branch` to a
  commit id when the bundle at a path can change.
  """

  mining: MiningConfig | None = None
  head: str = ""

  @classmethod
  def create(cls, mining: MiningConfig) -> GitDiffsConfig:
    head = "" if _is_bundle(mining.source) else _Git(mining.source).resolve(
        mining.branch)
    args = {**dataclasses.asdict(mining), "head": head}
    if not _is_bundle(mining.source):
      args["source"] = os.path.realpath(mining.source)
    digest = hashlib.sha256(
        json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
    base = posixpath.basename(mining.source.rstrip("/")) or "repo"
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", base).strip("_") or "repo"
    return cls(name=f"{slug}-{digest}", version=GitDiffs.VERSION,
               description=json.dumps(args, sort_keys=True),
               mining=mining, head=head)


class GitDiffs(TaskBuilder):
  """Diff tasks mined from a git history (SWE-RL style), split by commit time."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, data_dir: str, mining: MiningConfig | None = None,
               config: GitDiffsConfig | None = None, **kwargs):
    if (mining is None) == (config is None):
      raise ValueError("GitDiffs: give exactly one of mining= and config=")
    if config is None:
      config = GitDiffsConfig.create(mining)
    if not isinstance(config, GitDiffsConfig) or config.mining is None:
      raise ValueError(f"GitDiffs: config must be a GitDiffsConfig from "
                       f"GitDiffsConfig.create, got {config!r}")
    super().__init__(data_dir=data_dir, config=config, **kwargs)

  def _split_tasks(self) -> Mapping[str, Any]:
    result = mine(self.builder_config.mining,
                  revision=self.builder_config.head or None)
    # During preparation data_dir is the temporary directory tfds renames into
    # place on success, so the report lands next to the dataset's files.
    (epath.Path(self.data_dir) / REPORT_NAME).write_text(
        json.dumps(result.report, indent=2, sort_keys=True))
    return result.splits

  def build_report(self) -> dict[str, Any]:
    """The report written when the dataset was prepared."""
    path = epath.Path(self.data_dir) / REPORT_NAME
    if not path.exists():
      raise FileNotFoundError(f"{path} does not exist: call "
                              "download_and_prepare() first")
    return json.loads(path.read_text())
