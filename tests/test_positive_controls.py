"""Positive controls: each attack the suite shows contained really works where nothing
contains it.

A tampering program that scores 0 under the sandbox (tests/test_sandbox.py) is evidence
only if the same program scores a pass where it can reach the verdict. Here each one runs
under a naive runner, the obvious way to grade a program: its source, the task's trusted
context and the tests executed in one namespace of one interpreter, the verdict a line per
test ("<nonce> test i pass", then "<nonce> done") written by a local `emit` to a report
descriptor the parent reads. Every attack must pass there, while a plainly wrong
program fails (the runner does grade). The runners start a few at a time, each in its own
PID namespace (`unshare`, inside a user namespace where this user may make one) so that
an attack reading "/proc/1/mem" reads its own runner, not this machine's init; where no
PID namespace can be made at all, those tests skip and say why.

The hostile tool calls get the same treatment: a path out of the workspace does escape an
editor that joins paths with os.path.join; a command's output is megabytes where no cap
cuts it; in a plain shell, host files are read, the host's root and processes are listed,
a sleep outlives the session's limit and a loopback service answers. The fork bomb has no
control here: running one without limits is not safe on a shared machine.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time

import pytest

from rlcode.data.humaneval import humaneval_tasks
from rlcode.rewards.tests import job_for
from tampering import ATTACKS, TASKS

# Program, context and tests share `namespace`; the job dict and `emit` are locals of
# `run`, as a hand-written grader would have them. The job carries its limits as a dict,
# as job records do: that makes it a dict the garbage collector tracks (one of strings
# alone is untracked, and gc.get_objects would not list it).
NAIVE_RUNNER = r"""
import json, os, sys, unittest

def run(job, fd):
    nonce = os.urandom(16).hex()
    # Built once, as a grader would: it then sits in memory for a reader of /proc/self/mem.
    prefix = (nonce + ' ').encode()
    def emit(line):
        os.write(fd, prefix + line.encode() + b'\n')
    os.write(fd, (nonce + '\n').encode())
    namespace = {'__name__': '__main__'}
    exec(job['context'], namespace)
    exec(job['program'], namespace)
    tests = job['tests']
    if 'def check(' in tests:
        n_tests = 1
        exec(tests, namespace)
        cases = [lambda: namespace['check'](namespace[job['entry_point']])]
    elif 'unittest' in tests:
        exec(tests, namespace)
        suite = unittest.TestSuite()
        for value in list(namespace.values()):
            if isinstance(value, type) and issubclass(value, unittest.TestCase):
                suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(value))
        cases = list(suite)
        n_tests = len(cases)
        def unit(case):
            result = unittest.TestResult()
            case.run(result)
            assert result.wasSuccessful()
        cases = [lambda case=case: unit(case) for case in cases]
    else:
        n_tests = 1
        cases = [lambda: exec(tests, namespace)]
    for i, case in enumerate(cases):
        try:
            case()
            emit('test %d pass' % i)
        except Exception:
            emit('test %d fail' % i)
    emit('done')

run(json.loads(sys.stdin.read()), int(sys.argv[-1]))
"""


def _task(name):
  return TASKS[name] if name in TASKS else next(t for t in humaneval_tasks() if t.id == name)


# The runner's limits, set by prlimit before it execs unshare: nothing runs in the forked
# child of this (possibly threaded) process but the exec.
_LIMITS = ["prlimit", "--cpu=20", f"--as={2 << 30}", f"--fsize={1 << 20}", "--"]
# unshare kills the namespace's first process (and with it the namespace) if it is killed.
_PID_NAMESPACE = ["--pid", "--fork", "--mount-proc", "--kill-child"]
# A batch's runners start together; the batches run one after another, so a loaded
# 2-core machine is not asked to start all of them at once.
BATCH = 5
# For all the runners together; a runner alone takes well under a second.
DEADLINE_S = 300.0
_UNFINISHED = f"the naive runner did not finish within {DEADLINE_S:.0f} s of the first start"


def _namespace_command() -> list[str]:
  """The command prefix that runs a program in its own PID namespace under the limits:
  in a user namespace (any user, where the kernel allows unprivileged ones), else
  without one (root). Skips, saying why, where neither can be made."""
  if shutil.which("unshare") is None or shutil.which("prlimit") is None:
    pytest.skip("the naive runner needs util-linux's unshare and prlimit, not on PATH")
  errors = []
  for user in (["--user", "--map-root-user"], []):
    command = [*_LIMITS, "unshare", *user, *_PID_NAMESPACE]
    probe = subprocess.run([*command, "true"], capture_output=True, text=True, timeout=30,
                           check=False)
    if probe.returncode == 0:
      return command
    errors.append(f"{' '.join(['unshare', *user, *_PID_NAMESPACE])}: "
                  f"{probe.stderr.strip() or probe.returncode}")
  pytest.skip("no PID namespace for the naive runner (unprivileged user namespaces are "
              "off and this user is not root): " + "; ".join(errors))


def _start(prefix: list[str], job) -> tuple[subprocess.Popen, int]:
  read, write = os.pipe()
  proc = subprocess.Popen(
      [*prefix, sys.executable, "-I", "-c", NAIVE_RUNNER, str(write)],
      stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
      pass_fds=(write,))
  os.close(write)
  proc.stdin.write(json.dumps({"program": job.program, "tests": job.tests,
                               "context": job.context, "entry_point": job.entry_point,
                               "tests_format": job.tests_format,
                               "limits": {"seconds": 20}}).encode())
  proc.stdin.close()
  return proc, read


def _report(proc: subprocess.Popen, read: int, deadline: float) -> bytes | None:
  """The runner's report, read until it closes it (None if that is not by `deadline`,
  the runner then killed)."""
  chunks = []
  try:
    while time.monotonic() < deadline:
      if select.select([read], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(read, 1 << 16)
        if not chunk:
          proc.wait(timeout=max(1.0, deadline - time.monotonic()))
          return b"".join(chunks)
        chunks.append(chunk)
  except subprocess.TimeoutExpired:
    pass
  finally:
    os.close(read)
  proc.kill()
  proc.wait()
  return None


def _verdict(report: bytes | None) -> bool | None:
  """Passed, as the naive parent reads it: the first line is the nonce; every test the
  lines carrying it name passed, none failed, and the run said it was done. None: the
  runner did not finish in time, which is neither a pass nor a fail."""
  if report is None:
    return None
  lines = report.decode("utf-8", "replace").splitlines()
  if not lines:
    return False
  nonce, verdicts = lines[0], [line.split(" ", 1)[1] for line in lines[1:]
                               if line.startswith(lines[0] + " ")]
  return ("done" in verdicts and not any(v.endswith(" fail") for v in verdicts)
          and any(v.endswith(" pass") for v in verdicts) and len(nonce) == 32)


# A plainly wrong program per task: the naive runner must fail it, or its passes mean nothing.
WRONG = {"HumanEval/4": "    return 0\n", "HumanEval/32": "    return 0.0\n",
         "HumanEval/38": "    return s\n", "add": "def add(a, b):\n    return 0\n",
         "square_unittest": "def square(x):\n    return 0\n",
         "square_script": "def square(x):\n    return 0\n"}


@pytest.fixture(scope="module")
def naive_verdicts():
  jobs = {("attack", n): job_for(_task(t), c) for n, (t, c) in ATTACKS.items()}
  jobs.update({("wrong", t): job_for(_task(t), c) for t, c in WRONG.items()})
  prefix = _namespace_command()
  deadline = time.monotonic() + DEADLINE_S
  keys, verdicts = list(jobs), {}
  for i in range(0, len(keys), BATCH):
    started = {key: _start(prefix, jobs[key]) for key in keys[i:i + BATCH]}
    verdicts.update({key: _verdict(_report(*run, deadline)) for key, run in started.items()})
  return verdicts


def test_every_task_of_the_attacks_has_a_wrong_baseline():
  assert {task for task, _ in ATTACKS.values()} == set(WRONG)


@pytest.mark.parametrize("task", sorted(WRONG))
def test_the_naive_runner_fails_a_wrong_program(naive_verdicts, task):
  verdict = naive_verdicts["wrong", task]
  assert verdict is False, _UNFINISHED if verdict is None else "a wrong program passed"


@pytest.mark.parametrize("name", list(ATTACKS))
def test_each_tampering_attack_passes_under_the_naive_runner(naive_verdicts, name):
  verdict = naive_verdicts["attack", name]
  assert verdict is True, _UNFINISHED if verdict is None else "the attack failed"


def _naive_editor_read(root: str, path: str) -> str:
  with open(os.path.join(root, path)) as f:
    return f.read()


def _naive_editor_write(root: str, path: str, text: str) -> None:
  with open(os.path.join(root, path), "w") as f:
    f.write(text)


def test_paths_out_of_the_workspace_escape_a_naive_editor(tmp_path):
  """The editor's refusals (tests/test_agent_tools.py: "../../etc/x", "/etc/passwd") guard
  against escapes that are real: os.path.join keeps "..", and an absolute path replaces the
  root."""
  root = tmp_path / "ws" / "inner"
  root.mkdir(parents=True)
  secret = tmp_path / "secret.txt"
  secret.write_text("outside\n")
  _naive_editor_write(str(root), "../../x.txt", "escaped\n")
  assert (tmp_path / "x.txt").read_text() == "escaped\n"
  assert _naive_editor_read(str(root), str(secret)) == "outside\n"


def test_a_commands_output_is_unbounded_without_the_cap(tmp_path):
  """The session keeps the first max_output_bytes of a command; without that cap the same
  command (tests/test_agent_fuzz.py's) returns all of its 3,000,000 bytes."""
  out = subprocess.run("yes | head -c 3000000", shell=True, capture_output=True, timeout=20,
                       cwd=tmp_path, check=False).stdout
  assert len(out) == 3_000_000


def _plain_bash(command: str, cwd, timeout: float = 20.0) -> subprocess.CompletedProcess:
  """The unprotected path: the command in the host's bash, as a tool without a sandbox
  would run it."""
  return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                        timeout=timeout, check=False)


def test_hostile_bash_calls_succeed_in_a_plain_shell(tmp_path):
  """tests/test_agent_tools.py's hostile bash calls, which the session contains, do what
  they try where nothing contains them: host files are read, the host's root is listed,
  the host's processes are seen."""
  host_file = tmp_path / "host_secret.txt"
  host_file.write_text("host secret\n")
  r = _plain_bash(f"cat {host_file} /etc/hostname", tmp_path)
  assert r.returncode == 0 and "host secret" in r.stdout
  root = set(_plain_bash("ls /", tmp_path).stdout.split())
  assert {"etc", "proc", "usr"} <= root and root - {"sandbox", "usr", "proc", "dev", "tmp"}
  # The session shows at most 4 processes; the host runs this test's own tree at least.
  assert int(_plain_bash("ls /proc | grep -c '^[0-9]'", tmp_path).stdout) > 4


def test_a_sleeping_command_outlives_the_sessions_limit_in_a_plain_shell(tmp_path):
  """The session kills a command after its limit (2 s in tests/test_agent_tools.py); the
  plain shell lets it run to its end."""
  import time
  start = time.monotonic()
  assert _plain_bash("sleep 2.5; echo woke", tmp_path).stdout == "woke\n"
  assert time.monotonic() - start >= 2.5


def test_loopback_is_reachable_from_a_plain_process_and_not_from_the_sandbox(tmp_path):
  """A host service on 127.0.0.1 answers an unprotected process; a sandboxed command, in
  its own network namespace, cannot reach it."""
  import socket
  from rlcode.sandbox.session import Session, SessionLimits
  server = socket.create_server(("127.0.0.1", 0))
  port = server.getsockname()[1]
  probe = (f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2); "
           "print(\"connected\")'")
  try:
    assert _plain_bash(probe, tmp_path).stdout == "connected\n"
    with Session(SessionLimits(command_seconds=5.0, max_output_bytes=4096)) as s:
      r = s.exec(probe)
    assert "connected" not in r.output and "refused" in r.output.lower(), r.output
  finally:
    server.close()
