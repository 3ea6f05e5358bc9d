"""Git through its CLI: a repository or a cached bundle clone, logs, diffs, trees and blobs.

Everything goes through the git CLI (`git log`, `git diff-tree`,
`git cat-file --batch-command`, `git ls-tree`); nothing here parses git
objects.

Sources (`checkout`): a local repository is used where it is (its root, or a
bare repository's git dir). A bundle file, local or remote (`gs://...`, read
through epath), is cloned bare once into a cache and reused: the clone lives at
`<cache>/<first 20 hex digits of the bundle's sha256>.git`, with `<cache>` the
`cache_dir` argument, else $RLCODE_GIT_CACHE, else ~/.cache/rlcode/git. The key
is the bundle's content, so a changed bundle at the same path gets a new clone
and a bundle copied elsewhere reuses the old one. A remote bundle is downloaded
(to hash it) on every call; only the clone is cached. Clones are made in a
temporary directory beside the cache entry and renamed into place, so an
interrupted clone never leaves a half-made entry.

Errors in the source (`SourceError` and its subclasses) say what is wrong with
the input in one line, for the CLI to print.

This module must not filter or decide anything about tasks: it reads git.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence

from etils import epath

from rlcode.errors import BadInput
from rlcode.remote import require_filesystem

CACHE_ENV = "RLCODE_GIT_CACHE"
_HASH_CHUNK = 1 << 20


class SourceError(BadInput):
  """The source cannot be mined; the message is one line naming the problem."""


class NotARepositoryError(SourceError):
  """The source is not a git repository (or bundle), or not its root."""


class BundleError(NotARepositoryError):
  """The source is a file git cannot clone as a bundle (corrupt or not a bundle)."""


class EmptyRepositoryError(SourceError):
  """The repository has no commit at all."""


class UnknownBranchError(SourceError):
  """The branch (or tag, or commit) is not in the repository."""


class ShallowHistoryError(SourceError):
  """The repository is a shallow clone: its history is cut short."""


class GitError(RuntimeError):
  """A git command failed; the message has the command and git's stderr."""


@dataclasses.dataclass(frozen=True)
class Commit:
  """One commit of a log: its id, parents, committer time and raw message."""

  sha: str
  parents: tuple[str, ...]
  time: int
  message: bytes


@dataclasses.dataclass(frozen=True)
class Entry:
  """One file of `git diff-tree --raw` output; paths are raw bytes."""

  status: str
  old_mode: str
  new_mode: str
  old_sha: str
  new_sha: str
  path: bytes
  old_path: bytes | None


def is_bundle(source: str) -> bool:
  return "://" in source or os.path.isfile(source)


def cache_root(cache_dir: str | None = None) -> str:
  """Where bundle clones are cached (see the module docstring)."""
  return (cache_dir or os.environ.get(CACHE_ENV)
          or os.path.join(os.path.expanduser("~"), ".cache", "rlcode", "git"))


def _hash_into(source: str, out) -> str:
  """sha256 of `source`'s bytes, copying them to `out` when it is a file object."""
  h = hashlib.sha256()
  with epath.Path(source).open("rb") as f:
    while chunk := f.read(_HASH_CHUNK):
      h.update(chunk)
      if out is not None:
        out.write(chunk)
  return h.hexdigest()


def checkout(source: str, cache_dir: str | None = None) -> str:
  """A local repository path for `source`: itself, or the cached clone of a bundle.

  Raises:
    BundleError: git cannot clone the bundle.
    NotARepositoryError: a remote bundle is not there.
    BadInput: a remote source other than gs://, or gcsfs not installed.
  """
  if not is_bundle(source):
    return source
  require_filesystem(source, "source")
  root = cache_root(cache_dir)
  os.makedirs(root, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix="clone-", dir=root) as tmp:
    if "://" in source:
      bundle = os.path.join(tmp, "source.bundle")
      try:
        with open(bundle, "wb") as out:
          digest = _hash_into(source, out)
      except (FileNotFoundError, IsADirectoryError):
        raise NotARepositoryError(f"source {source!r}: no such bundle object") from None
    else:
      bundle, digest = source, _hash_into(source, None)
    target = os.path.join(root, digest[:20] + ".git")
    if os.path.isdir(target):
      return target
    made = os.path.join(tmp, "repo.git")
    r = subprocess.run(["git", "clone", "--bare", "--quiet", bundle, made],
                       capture_output=True, env=git_env(), check=False)
    if r.returncode:
      reason = r.stderr.decode(errors="replace").strip().splitlines()
      raise BundleError(f"source {source!r} is a file but not a git bundle git can "
                        f"clone: {reason[-1] if reason else 'git clone failed'}")
    try:
      os.rename(made, target)
    except OSError:
      # Another process renamed its clone of the same bundle into place first.
      if not os.path.isdir(target):
        raise
      shutil.rmtree(made)
  return target


def git_env() -> dict[str, str]:
  # A GIT_DIR or GIT_INDEX_FILE inherited from a hook would redirect every
  # command to another repository.
  env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
  env["GIT_TERMINAL_PROMPT"] = "0"
  return env


class Git:
  """Runs git commands against one repository."""

  def __init__(self, path: str):
    if not os.path.exists(path):
      raise NotARepositoryError(f"source {path!r} does not exist")
    self._env = git_env()
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
    raise UnknownBranchError(f"branch {revision!r} is not a commit of {self.git_dir!r}")

  def shallow_commits(self) -> frozenset[str]:
    if self.run("rev-parse", "--is-shallow-repository").strip() != b"true":
      return frozenset()
    path = self.run("rev-parse", "--git-path", "shallow").decode().strip()
    with open(os.path.abspath(path)) as f:
      return frozenset(line.strip() for line in f if line.strip())

  def first_parent_log(self, head: str, max_commits: int) -> list[Commit]:
    """First-parent history of `head`, oldest first."""
    args = ["--first-parent"] + (["-n", str(max_commits)] if max_commits else [])
    return self.log(*args, head)

  def brought_in(self, merge: Commit) -> list[Commit]:
    """The commits `merge` brings into its first parent's history, oldest first.

    In topological order, so each comes after its parents; merges on the
    merged branch are included (the caller decides what they mean).
    """
    return [c for c in self.log("--topo-order", f"^{merge.parents[0]}", merge.sha)
            if c.sha != merge.sha]

  def log(self, *revisions: str) -> list[Commit]:
    """`git log` of `revisions` (options and commits), oldest first."""
    out = self.run("log", "-z", "--no-show-signature",
                   "--format=%H%x1f%P%x1f%ct%x1f%B", *revisions, "--")
    commits = []
    for record in out.split(b"\0"):
      if not record.strip():
        continue
      fields = record.split(b"\x1f", 3)
      # 40 hex digits, or 64 in a SHA-256 repository.
      if len(fields) != 4 or not re.fullmatch(
          rb"\n?[0-9a-f]{40}(?:[0-9a-f]{24})?", fields[0]):
        raise GitError(f"unexpected git log record {record[:100]!r}")
      commits.append(Commit(
          sha=fields[0].strip().decode(),
          parents=tuple(fields[1].decode().split()),
          time=int(fields[2]), message=fields[3]))
    return commits[::-1]

  def changes(self, sha: str, base: str | None = None, renames: bool = True) -> list[Entry]:
    """What `sha` changes against `base` (default: its only parent, or nothing for a root);
    renames=False reports a renamed file as a deletion and an addition."""
    revisions = [base, sha] if base else ["--root", sha]
    out = self.run("diff-tree", "-r", "-z", "--no-commit-id", "--raw",
                   "-M" if renames else "--no-renames", "--no-ext-diff", *revisions)
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
      # -M (or --no-renames) without -C: added, modified, deleted, renamed or type-changed.
      if status[0] not in "AMDRT":
        raise GitError(f"unexpected git diff-tree status {status!r}")
      if status[0] == "R":
        old_path, path = tokens[i], tokens[i + 1]
        i += 2
      else:
        old_path, path = None, tokens[i]
        i += 1
      entries.append(Entry(status[0], old_mode, new_mode, old_sha, new_sha,
                            path, old_path))
    return entries

  def tree_files(self, commit: str, directory: str = "",
                 recursive: bool = False) -> list[tuple[str, str, str, int]]:
    """(mode, sha, path, size) of the blobs in `directory` ("": the root), or under it."""
    args = ["ls-tree", "-z", "-l", "--full-tree", *(["-r"] if recursive else []), commit]
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
  def blobs(self) -> Iterator[Blobs]:
    proc = subprocess.Popen(
        ["git", f"--git-dir={self.git_dir}", "cat-file", "--batch-command"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=self._env)
    try:
      yield Blobs(proc)
    finally:
      proc.stdin.close()
      proc.stdout.close()
      proc.wait()
      proc.stderr.close()


class Blobs:
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
