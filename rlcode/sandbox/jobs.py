"""What a sandboxed run is given and what it gives back: Limits, Job, Result.

Plain data only: nothing here starts a process, plans tests or reads a report.
"""

from __future__ import annotations

import dataclasses

STATUSES = ("passed", "failed", "timeout", "memory", "crash", "syntax_error",
            "sandbox_error")


class SandboxUnavailableError(RuntimeError):
  """The requested backend cannot run a sandboxed program."""


def check_positive(limits) -> None:
  """Every field of a limits dataclass must be a positive number (the error names it)."""
  for field in dataclasses.fields(limits):
    value = getattr(limits, field.name)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
      raise ValueError(f"{type(limits).__name__}.{field.name} must be a positive number, "
                       f"got {value!r}")


def rlimits(limits) -> dict[str, list[int]]:
  """The setrlimit values (soft, hard) a sandboxed process takes from its limits."""
  cpu = int(-(-limits.cpu_seconds // 1))
  return {
      "RLIMIT_CPU": [cpu, cpu + 1],
      "RLIMIT_AS": [limits.memory_bytes, limits.memory_bytes],
      "RLIMIT_NPROC": [limits.max_processes, limits.max_processes],
      "RLIMIT_FSIZE": [limits.max_file_bytes, limits.max_file_bytes],
      "RLIMIT_NOFILE": [limits.max_open_files, limits.max_open_files],
      "RLIMIT_CORE": [0, 0],
  }


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
      the host user is root; see the `rlcode.sandbox` docstring.
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
    check_positive(self)
    if self.max_open_files < 16:
      raise ValueError(f"Limits.max_open_files={self.max_open_files} is too small "
                       "for the interpreter to start; use at least 16")

  def rlimits(self) -> dict[str, list[int]]:
    return rlimits(self)


@dataclasses.dataclass(frozen=True)
class Job:
  """One program and the tests to run against it.

  Attributes:
    program: Python source, run as a module named `module_name`.
    tests: test source (see `plan.plan_tests` for the formats), or a sequence
      of test snippets, each one test (for example a list of assert statements).
    entry_point: the function check-style tests receive as `candidate`.
    tests_format: "auto", "check", "script" or "unittest" (see `plan.plan_tests`).
    module_name: `__name__` of the program; not "__main__", so a whole-program
      completion's `if __name__ == "__main__":` block does not run.
    context: trusted source run in the tests' namespace before them, for
      helpers the tests use that the program also has (functions given in a
      prompt): names it binds are the tests' own, never the program's.
    probes: argument tuples (plain data) for calls of the entry point after the
      tests, whose answers come back as `Result.outputs`: what the program
      does on inputs, as data (behaviour signatures for majority voting).
  """

  program: str
  tests: str | tuple[str, ...]
  entry_point: str = ""
  tests_format: str = "auto"
  module_name: str = "solution"
  context: str = ""
  # Arguments may hold lists: left out of the hash, compared by ==.
  probes: tuple[tuple, ...] = dataclasses.field(default=(), hash=False)

  def __post_init__(self):
    if isinstance(self.tests, list):  # plans are cached by tests: keep them hashable
      object.__setattr__(self, "tests", tuple(self.tests))
    probes = self.probes
    if not isinstance(probes, (tuple, list)) or not all(isinstance(a, (tuple, list))
                                                        for a in probes):
      raise ValueError(f"Job.probes must be a sequence of argument tuples, got {probes!r:.80}")
    object.__setattr__(self, "probes", tuple(tuple(a) for a in probes))
    if self.probes and not self.entry_point:
      raise ValueError("Job.probes call the entry point: give entry_point")


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
    outputs: per probe of the job, ("return", value) with the value rebuilt as
      plain data, ("raise", the builtin exception type's name, or
      "ProgramError"), or ("large", sha256 hex of the value's encoding) for a
      value whose encoding passes 16 KiB; empty unless the report is complete
      (the probes run after the tests, in the same program process).
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
  outputs: tuple[tuple[str, object], ...] = ()
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

