"""A long-lived sandbox session: one workspace for a whole multi-turn episode.

`Session()` starts one sandboxed server process (`session_server.py`, passed as
text) that holds a workspace, a private size-capped tmpfs, for as long as the
session lives, and serves one request at a time over a pipe: run a bash command,
read, write or list files. Files written in one call are there in the next;
nothing of the workspace reaches the host filesystem, and what comes back is plain
data (strings, numbers) of bounded size.

Isolation is the package's bubblewrap setup (see `rlcode.sandbox`; the command
line is `launch.Bwrap.session`): new user, pid, net, ipc and uts namespaces, the
read-only minimal root, no host files beyond the system and interpreter trees, a
scrubbed environment. Sessions never run under the `unshare` backend. A session may be
given host directories bound read-only at fixed paths (`mounts`: a test environment, a
repository's dependencies) and extra variables for its commands' environment (`env`:
PYTHONPATH to them); nothing else of the host is added. Unlike a
single-turn job, a session must create processes (bash runs commands), so its
seccomp filter is the package's `allow_fork` one: fork and clone are allowed;
ptrace, process_vm_*, mount, unshare, setns, bpf, keyrings, io_uring and the
other denied calls are not. Process creation is then bounded by RLIMIT_NPROC,
which the kernel does not apply to host uid 0; so when the host process is root,
the session is started through `setpriv` as host uid 65534 (its processes count
against that user in the session's own user namespace, so sessions do not share
the limit). That user must be able to reach the interpreter; see `Session`.

Limits per call (`SessionLimits`): each command runs under rlimits (CPU seconds,
address space, processes, file size, open files), a wall clock after which the
server kills it, and an output cap (the first `max_output_bytes` are kept; past
`output_limit_bytes` the command is killed). After every command the server
kills every other process in the session (it is the pid namespace's init), so no
command outlives its call. Reads are capped at `max_read_bytes`, writes at
`max_file_bytes`, listings at `max_files`, and paths resolve inside the workspace
(symlinks included) or are refused. The host gives every call a deadline (its
timeout plus a grace); a server that misses it is killed, and the session is dead.

Threat model. Defends against what a policy's commands may do by accident or on
purpose: fork bombs, endless loops, huge outputs or files, reading host files,
writing outside the workspace, network access, leaving processes behind, and
attacking the server (it is non-dumpable, so same-uid processes cannot read its
memory or file descriptors through /proc; ptrace is denied; signals sent from
inside the namespace do not reach its init). A command that did take over the
server could only change what later calls return, never the host: rewards are
computed elsewhere (the tests run the workspace's files as a program in a separate
single-turn sandbox job). Does NOT defend against kernel exploits, side channels,
or denial of service below the limits (CPU contention, the tmpfs up to its size,
up to max_processes processes each with its own address-space limit). Command
output and file contents are program-controlled text: treat them as untrusted
data.

This module must not know about tasks, tools or rewards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import select
import struct
import subprocess
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path

from rlcode.sandbox import jobs, launch, supervise
from rlcode.sandbox.jobs import SandboxUnavailableError

_SERVER_SOURCE = Path(__file__).with_name("session_server.py").read_text()
_GRACE_S = 5.0
_START_S = 20.0
_MAX_FRAME = 64 << 20


class SessionError(RuntimeError):
  """A request the session refused (the message says why), or a session that died."""


@dataclasses.dataclass(frozen=True)
class SessionLimits:
  """Limits of a session and of each call.

  Attributes:
    command_seconds: default wall clock of one command.
    cpu_seconds: RLIMIT_CPU of each command's processes.
    memory_bytes: RLIMIT_AS of each command's processes.
    max_processes: RLIMIT_NPROC: processes of the session at once (the server counts).
    max_file_bytes: RLIMIT_FSIZE of commands; also the largest `write`.
    max_open_files: RLIMIT_NOFILE of commands.
    workdir_bytes: size of the workspace tmpfs and of /tmp.
    max_output_bytes: output of one command kept (stdout and stderr together).
    output_limit_bytes: output after which a command is killed.
    max_read_bytes: the largest file `read` returns.
    max_files: entries `files` lists at most.
  """

  command_seconds: float = 5.0
  cpu_seconds: int = 10
  memory_bytes: int = 512 << 20
  max_processes: int = 32
  max_file_bytes: int = 4 << 20
  max_open_files: int = 64
  workdir_bytes: int = 32 << 20
  max_output_bytes: int = 16 << 10
  output_limit_bytes: int = 1 << 20
  max_read_bytes: int = 1 << 20
  max_files: int = 1000

  def __post_init__(self):
    jobs.check_positive(self)
    if self.max_processes < 4:
      raise ValueError(f"SessionLimits.max_processes={self.max_processes}: the server and "
                       "bash need at least 4")

  def rlimits(self) -> dict[str, list[int]]:
    return jobs.rlimits(self)


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """A command's output (stdout and stderr interleaved, cut at max_output_bytes), its exit
  code (None when it was killed), and whether it timed out or its output was cut."""

  output: str
  exit_code: int | None
  timed_out: bool
  truncated: bool


def _stop(proc: subprocess.Popen, fds: list[int]) -> None:
  """Kills a session's sandbox (if it still runs), reaps it and closes its pipes."""
  if proc.returncode is None:
    supervise.kill(proc)
    try:
      proc.wait(timeout=_GRACE_S)
    except subprocess.TimeoutExpired:
      supervise.kill_group(proc)
      proc.wait()
  for fd in fds:
    try:
      os.close(fd)
    except OSError:
      pass


class Session:
  """One sandboxed workspace and its server; use as a context manager or `close()` it.

  Args:
    limits: SessionLimits.
    python: the interpreter inside the session (the server's, and `python3` on the
      commands' PATH). Default: this process's base interpreter, unless the host is
      root and uid 65534 cannot reach it (a pyenv under /root); then /usr/bin/python3.
    mounts: sandbox path -> host directory, bound read-only; sandbox paths lie under
      /opt or /mnt (never over the workspace, /tmp or the system trees).
    env: variables added to the commands' environment (names of capitals, digits and _).

  Raises:
    SandboxUnavailableError: bubblewrap cannot start (sessions never fall back to a
      launcher without filesystem isolation), or the host is root and has no setpriv.
  """

  def __init__(self, limits: SessionLimits | None = None, *, python: str | None = None,
               mounts: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None):
    self.limits = limits or SessionLimits()
    self._lock = threading.Lock()
    self._proc = None
    binds = _checked_mounts(mounts or {})
    extra_env = _checked_env(env or {})
    bwrap = launch.choose("bwrap", _server_python(python))
    req_r, self._req = os.pipe()
    self._resp, resp_w = os.pipe()
    try:
      spec = bwrap.session(self.limits.workdir_bytes, req_r, resp_w, _SERVER_SOURCE, binds)
    except SandboxUnavailableError:
      for fd in (req_r, self._req, self._resp, resp_w):
        os.close(fd)
      raise
    try:
      self._proc = subprocess.Popen(
          spec.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL, pass_fds=spec.pass_fds, env=spec.env,
          start_new_session=True)
    except OSError as e:
      os.close(self._req)
      os.close(self._resp)
      raise SandboxUnavailableError(f"cannot start a session: {e}") from e
    finally:
      for fd in spec.close_after_spawn:
        os.close(fd)
    # A session never outlives its owner, nor the interpreter: the finalizer runs when
    # the Session is collected or at exit (before modules are torn down, unlike __del__).
    self._finalizer = weakref.finalize(self, _stop, self._proc, [self._req, self._resp])
    self._alive = True
    config = {"rlimits": self.limits.rlimits(), "env": {**bwrap.command_env(), **extra_env},
              "max_output_bytes": self.limits.max_output_bytes,
              "output_limit_bytes": self.limits.output_limit_bytes,
              "max_read_bytes": self.limits.max_read_bytes, "max_files": self.limits.max_files}
    try:
      self._call(config, _START_S)
    except SessionError as e:
      raise SandboxUnavailableError(f"a session did not start: {e}") from e

  @property
  def alive(self) -> bool:
    return self._alive

  def exec(self, command: str, *, timeout: float | None = None) -> ExecResult:
    """Runs `bash -c command` in the workspace; killed after `timeout` seconds."""
    timeout = float(self.limits.command_seconds if timeout is None else timeout)
    r = self._call({"op": "exec", "command": command, "timeout": timeout}, timeout + _GRACE_S)
    return ExecResult(r["output"], r["exit_code"], r["timed_out"], r["truncated"])

  def read(self, path: str) -> str:
    """The text of a workspace file (undecodable bytes replaced)."""
    return self._call({"op": "read", "path": path}, _GRACE_S)["text"]

  def write(self, path: str, text: str) -> None:
    """Creates or overwrites a workspace file (and its parent directories)."""
    if len(text.encode("utf-8")) > self.limits.max_file_bytes:
      raise SessionError(f"{path}: more than {self.limits.max_file_bytes} bytes")
    self._call({"op": "write", "path": path, "text": text}, _GRACE_S)

  def files(self) -> list[str]:
    """The workspace's regular files, relative paths, sorted (symlinks not followed)."""
    return self._call({"op": "files"}, _GRACE_S)["files"]

  def close(self) -> None:
    """Ends the session; the workspace vanishes with it."""
    if self._proc is None:
      return
    if self._alive:
      try:
        self._call({"op": "close"}, _GRACE_S)
      except SessionError:
        pass
    self._kill()

  def __enter__(self) -> Session:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _kill(self) -> None:
    self._alive = False
    self._finalizer()
    self._req = self._resp = -1

  def _call(self, request: dict, seconds: float) -> dict:
    with self._lock:
      if not self._alive:
        raise SessionError("the session has ended")
      data = json.dumps(request).encode()
      try:
        _write_all(self._req, struct.pack(">I", len(data)) + data)
        head = self._read(4, seconds)
        (n,) = struct.unpack(">I", head)
        if n > _MAX_FRAME:
          raise SessionError(f"a reply of {n} bytes")
        reply = json.loads(self._read(n, seconds))
      except (OSError, ValueError, SessionError) as e:
        self._kill()
        raise SessionError(f"the session died ({e}); its workspace is gone") from None
    if not reply.get("ok"):
      raise SessionError(reply.get("error", "refused"))
    return reply

  def _read(self, n: int, seconds: float) -> bytes:
    deadline = time.monotonic() + seconds
    out = b""
    while len(out) < n:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([self._resp], [], [], left)[0]:
        raise SessionError(f"no reply within {seconds:.0f} s")
      chunk = os.read(self._resp, n - len(out))
      if not chunk:
        raise SessionError("the server exited")
      out += chunk
    return out


_MOUNT_ROOTS = ("/opt/", "/mnt/")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def _checked_mounts(mounts: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
  """(host, sandbox) pairs of `mounts` (sandbox -> host), checked; ValueError names the
  bad one. A root host runs the session as uid 65534, which must reach the directory."""
  out = []
  for inside, host in sorted(mounts.items()):
    norm = os.path.normpath(inside)
    if norm != inside or not inside.startswith(_MOUNT_ROOTS) or inside.startswith(
        launch.PYTHON_MOUNT):
      raise ValueError(f"mounts: {inside!r} must be a normalised path under "
                       f"{' or '.join(_MOUNT_ROOTS)} (not {launch.PYTHON_MOUNT})")
    if not os.path.isdir(host):
      raise ValueError(f"mounts: {host!r} (for {inside!r}) is not a directory")
    if os.geteuid() == 0 and not _world_reachable(host):
      raise ValueError(f"mounts: {host!r} is not readable by uid 65534, whom a root "
                       "host runs the session as")
    out.append((os.path.realpath(host), inside))
  return tuple(out)


def _checked_env(env: Mapping[str, str]) -> dict[str, str]:
  for name, value in env.items():
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name) or not isinstance(
        value, str) or "\0" in value:
      raise ValueError(f"env: {name!r}={value!r:.80} is not a variable name and a string")
  return dict(env)


def _world_reachable(path: str) -> bool:
  """Whether a user with no special rights can traverse to `path` and execute it (a
  directory: list and enter it)."""
  parts = Path(os.path.realpath(path)).parts
  for i in range(1, len(parts)):
    if not os.stat(os.path.join(*parts[:i])).st_mode & 0o001:
      return False
  return bool(os.stat(path).st_mode & 0o005 == 0o005)


def interpreter_path(python: str | None = None) -> str:
  """The host path of the interpreter a `Session(python=python)` runs."""
  chosen = _server_python(python)
  return launch.interpreter(chosen).host_exe


def _server_python(python: str | None) -> str | None:
  if python is not None or os.geteuid() != 0:
    return python
  base = launch.interpreter(None).host_exe
  if _world_reachable(base):
    return None
  if os.path.isfile("/usr/bin/python3"):
    return "/usr/bin/python3"
  raise SandboxUnavailableError(f"a session runs as uid 65534, which cannot reach {base}; "
                                "pass python= an interpreter it can run")


def _write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]
