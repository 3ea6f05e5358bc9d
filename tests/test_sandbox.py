"""The sandbox: hostile and tampering programs are contained and score 0; honest ones count."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import socket
import sys
import time
from pathlib import Path

import pytest
from tampering import ATTACKS, TASKS

from rlcode import sandbox as sb
from rlcode.data.humaneval import humaneval_tasks
from rlcode.rewards.tests import job_for
from rlcode.sandbox import launch, supervise

REPO = Path(__file__).resolve().parents[1]
MARKER = "rlcode-hostile-marker-5c1e"
LIMITS = sb.Limits(wall_seconds=3.0, cpu_seconds=1, memory_bytes=256 << 20,
                   max_file_bytes=1 << 20, max_open_files=32, workdir_bytes=4 << 20,
                   max_output_bytes=4096, output_limit_bytes=1 << 20)

ADD_TESTS = """
def check(candidate):
    assert candidate(1, 2) == 3
    assert candidate(-1, 1) == 0
    assert candidate(10, 5) == 15
"""
GOOD_ADD = "def add(a, b):\n    return a + b\n"
WRONG_ADD = "def add(a, b):\n    return 0\n"


# A listening socket on the host's loopback: the sandbox must not reach it.
_LISTENER = socket.socket()
_LISTENER.bind(("127.0.0.1", 0))
_LISTENER.listen(1)
HOST_PORT = _LISTENER.getsockname()[1]
EXPECTED_ROOT = sorted(
    [p[1:] for p in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
     if os.path.islink(p) or os.path.isdir(p)]
    + ["dev", "proc", "sandbox", "tmp", "usr"]
    + (["opt"] if launch.interpreter(None).mount else []))
SECRET = "rlcode-secret-env-value-77"
os.environ["RLCODE_TEST_SECRET"] = SECRET  # must not reach the sandbox

# name -> (program, expected status, regex searched in error + stderr, stdout check or None).
# Which of the CPU limit or the wall clock ends a busy loop depends on the
# machine's load, so those accept either.
HOSTILE = {
    "infinite_loop": ("while True:\n    pass\n", "timeout", "CPU limit|wall clock", None),
    "sleep_forever": ("import time\ntime.sleep(1000)\n", "timeout", "wall clock", None),
    "ignore_sigxcpu_and_sigterm": (
        "import signal\nfor s in (signal.SIGXCPU, signal.SIGTERM, signal.SIGINT):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n",
        "timeout", "SIGKILL|wall clock", None),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()\n", "failed", "PermissionError", None),
    "spawn_subprocess": (
        "import os, subprocess\nprint('system', os.system('echo pwned'), flush=True)\n"
        "subprocess.run(['/bin/echo', 'pwned'])\n",
        "failed", "PermissionError", lambda out: out.startswith("system ") and "pwned" not in out),
    "unbounded_allocation": ("x = []\nwhile True:\n    x.append(bytearray(10**7))\n",
                             "memory", "MemoryError", None),
    "huge_single_allocation": ("x = bytearray(10**11)\n", "memory", "MemoryError", None),
    "network_socket": (
        "import socket\nfor addr in [('1.1.1.1', 80), ('127.0.0.1', %d)]:\n"
        "    try:\n        socket.create_connection(addr, timeout=1)\n"
        "        print('CONNECTED', addr)\n"
        "    except OSError as e:\n        print('blocked', addr, e.errno)\n"
        "socket.getaddrinfo('pypi.org', 443)\n" % HOST_PORT,
        "failed", "gaierror", lambda out: "CONNECTED" not in out and out.count("blocked") == 2),
    "write_outside_workdir": (
        "import os\nok = []\n"
        "for d in ['/', '/usr', '/opt/python', '/dev', '/proc', '/etc', '/work', '/root', %r]:\n"
        "    try:\n        open(os.path.join(d, %r), 'w').write('x')\n        ok.append(d)\n"
        "    except OSError:\n        pass\n"
        "for d in ['/sandbox', '/tmp']:\n    open(os.path.join(d, %r), 'w').write('x')\n"
        "print('WROTE', ok)\n" % (str(REPO), MARKER, MARKER),
        "failed", "KeyError", lambda out: "WROTE []" in out),
    "read_host_files": (
        "import glob, os, json, sys\n"
        "paths = ['/etc/shadow', '/etc/passwd', '/home', '/root', '/work', %r, %r, %r]\n"
        "seen = {p: os.path.exists(p) for p in paths}\n"
        "sp = glob.glob(sys.prefix + '/lib/python3*/site-packages/*')\n"
        "print(json.dumps({'seen': seen, 'site_packages': sp, 'root': sorted(os.listdir('/'))}))\n"
        % (str(REPO), sys.prefix, os.path.expanduser("~")),
        "failed", "KeyError",
        lambda out: (lambda d: not any(d["seen"].values()) and d["site_packages"] == []
                     and d["root"] == EXPECTED_ROOT)(json.loads(out))),
    "read_host_environment": (
        "import os\nprint(sorted(os.environ.items()))\n", "failed", "KeyError",
        lambda out: SECRET not in out and "RLCODE" not in out and "/work" not in out),
    "proc_shows_only_the_sandbox": (
        "import os\npids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print('PIDS', pids, os.getuid(), os.getgid(), os.uname().nodename)\n",
        "failed", "KeyError", lambda out: "PIDS [1, 2] 65534 65534 sandbox" in out),
    "segfault_ctypes": ("import ctypes\nctypes.string_at(0)\n", "crash", "SIGSEGV", None),
    "print_gigabytes": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
                        "crash", "output exceeded", None),
    "stderr_gigabytes": ("import sys\nwhile True:\n    sys.stderr.write('y' * 65536)\n",
                         "crash", "output exceeded", None),
    "sys_exit_before_tests": ("import sys\nsys.exit(0)\n" + GOOD_ADD, "failed", "SystemExit",
                              None),
    "os_exit_before_tests": ("import os\nos._exit(0)\n" + GOOD_ADD, "crash",
                             "exited with code 0", None),
    "fake_success_lines": (
        "print('test 0 pass\\ntest 1 pass\\ntest 2 pass\\ndone\\nALL TESTS PASSED', flush=True)\n"
        + WRONG_ADD, "failed", "AssertionError", None),
    "fake_success_then_exit": (
        "print('3 passed, 0 failed', flush=True)\nimport os\nos._exit(0)\n",
        "crash", "exited with code 0", None),
    "forge_report_on_every_fd": (
        "import os\nfor fd in range(3, 256):\n    try:\n"
        "        os.write(fd, b'start\\ntest 0 pass\\ntest 1 pass\\ntest 2 pass\\ndone\\n')\n"
        "    except OSError:\n        pass\n" + GOOD_ADD,
        "crash", "broke the call protocol", None),
    "read_job_fd_for_nonce": (
        "import os\nfound = []\nfor fd in range(0, 256):\n    try:\n"
        "        data = os.pread(fd, 1 << 16, 0)\n"
        "        found.append((fd, b'\"nonce\"' in data))\n"
        "    except OSError:\n        pass\n"
        "print('FOUND', [f for f, has in found if has])\n"
        + WRONG_ADD, "failed", "AssertionError", lambda out: "FOUND []" in out),
    "kill_parent": ("import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n"
                    "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
                    + WRONG_ADD, "failed", "AssertionError", None),
    "kill_process_group": ("import os, signal\nos.killpg(0, signal.SIGKILL)\n"
                           "os.kill(os.getpid(), signal.SIGKILL)\n" + WRONG_ADD,
                           "crash", "program killed by SIGKILL", None),
    "signal_the_test_process": (
        "import os, signal\ndef add(a, b):\n"
        "    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGXCPU, signal.SIGUSR1,\n"
        "              signal.SIGHUP, signal.SIGALRM, signal.SIGKILL, signal.SIGSTOP):\n"
        "        for pid in (1, os.getppid(), -1):\n            try:\n"
        "                os.kill(pid, s)\n            except OSError:\n                pass\n"
        "    return 0\n", "failed", "AssertionError", None),
    # The harness is non-dumpable: its /proc files do not open for the program's uid
    # (listing /proc/1/fd does when the host is root: the sandbox uid is then the
    # owner of record of non-dumpable processes; following the links does not).
    "open_the_test_process_proc_files": (
        "import os\nopened = []\n"
        "paths = ['/proc/1/' + n for n in ('mem', 'environ', 'maps', 'syscall', 'stack',\n"
        "                                  'cwd/.', 'root/etc')]\n"
        "try:\n    paths += ['/proc/1/fd/' + fd for fd in os.listdir('/proc/1/fd')]\n"
        "except OSError:\n    pass\n"
        "for path in paths:\n    try:\n"
        "        os.listdir(path) if path.endswith(('/.', '/etc')) else open(path, 'rb').read(1)\n"
        "        opened.append(path)\n    except OSError:\n        pass\n"
        "print('OPENED', opened, len(paths))\n" + WRONG_ADD,
        "failed", "AssertionError", lambda out: out.startswith("OPENED [] ")),
    "forge_replies_on_the_call_channel": (
        "import os\nfor fd in range(3, 64):\n"
        "    data = b'l2:s6:returni3;'\n    try:\n"
        "        os.write(fd, len(data).to_bytes(8, 'little') + data)\n"
        "    except OSError:\n        pass\n" + WRONG_ADD,
        "crash", "broke the call protocol", None),
    "close_all_fds": ("import os\nos.closerange(0, 1024)\n" + GOOD_ADD, "crash", "exited", None),
    "monkeypatch_harness": (
        "import builtins, os, sys, __main__\n"
        "builtins.next = lambda g: (0, None)\nbuiltins.type = lambda x: int\n"
        "builtins.BaseException = ()\nos.write = lambda fd, data: len(data)\n"
        "os.getpid = lambda: 2\nsys.exit = lambda *a: None\n__main__.__dict__.clear()\n"
        + WRONG_ADD, "failed", "AssertionError", None),
    "raise_in_candidate": (
        "def add(a, b):\n    raise SystemExit(0)\n", "failed", "SystemExit", None),
    "deep_recursion": ("def f(n):\n    return f(n + 1)\nf(0)\n", "failed", "RecursionError",
                       None),
    "deep_recursion_raised_limit": (
        "import sys\nsys.setrecursionlimit(10**8)\nclass A:\n    def __getattr__(self, name):\n"
        "        return getattr(self, name)\nA().x\n", "crash", "SIGSEGV", None),
    "huge_file": ("with open('big', 'wb') as f:\n    f.write(b'x' * (10 << 20))\n",
                  "failed", "File too large", None),
    "fill_tmpfs": ("i = 0\nwhile True:\n    open('/tmp/f%d' % i, 'wb').write(b'x' * (900 << 10))\n"
                   "    i += 1\n", "failed", "No space left", None),
    "too_many_open_files": ("fs = []\nwhile True:\n    fs.append(open('/dev/null'))\n", "failed",
                            "Too many open files", None),
    "threads_spinning": (
        "import threading\ndef spin():\n    while True:\n        pass\n"
        "for _ in range(6):\n    threading.Thread(target=spin, daemon=False).start()\n"
        "while True:\n    pass\n", "timeout", "CPU limit|wall clock", None),
    "threads_spinning_after_wrong_answer": (
        "import threading\ndef spin():\n    while True:\n        pass\n"
        "for _ in range(4):\n    threading.Thread(target=spin).start()\n" + WRONG_ADD,
        "failed", "AssertionError", None),
    "nested_namespace": (
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "print('unshare', libc.unshare(0x10000000), flush=True)\n"
        + WRONG_ADD, "failed", "AssertionError", lambda out: "unshare -1" in out),
    "syntax_error": ("def add(a, b:\n    return a + b\n", "syntax_error", "SyntaxError", None),
    "null_bytes": ("x = 1\x00\n", "syntax_error", "null bytes", None),
}


def _leftover_processes(inode: int, ended: float) -> list[int]:
  """Processes in pid namespace `inode` that started before the run ended.

  The kernel recycles namespace inode numbers at once, so a process of a later
  run may sit in a namespace with the same number; its start time tells it apart.
  `ended` is CLOCK_BOOTTIME seconds, the clock of /proc/PID/stat's start time,
  which has a resolution of one tick: hence the margin.
  """
  target, ticks, found = f"pid:[{inode}]", os.sysconf("SC_CLK_TCK"), []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        if os.readlink(f"/proc/{entry}/ns/pid") != target:
          continue
        with open(f"/proc/{entry}/stat") as f:
          stat = f.read()
      except OSError:
        continue
      started = int(stat[stat.rindex(")") + 2:].split()[19]) / ticks
      if started < ended - 2.0 / ticks:
        found.append(int(entry))
  return found


@pytest.fixture(scope="module", autouse=True)
def _close_listener():
  yield
  _LISTENER.close()


@pytest.fixture(scope="module")
def box():
  return sb.Sandbox(LIMITS, workers=2)


@pytest.fixture(scope="module")
def hostile_results(box):
  """Every hostile program, each followed by an honest one, two at a time.

  Returns ({name: (result, boot time at its end)}, [honest results]).
  """
  def run(job):
    result = box.run(job)
    return result, time.clock_gettime(time.CLOCK_BOOTTIME)
  jobs = []
  for program, *_ in HOSTILE.values():
    jobs.append(sb.Job(program, ADD_TESTS, "add"))
    jobs.append(sb.Job(GOOD_ADD, ADD_TESTS, "add"))
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = list(pool.map(run, jobs))
  return dict(zip(HOSTILE, results[0::2])), [r for r, _ in results[1::2]]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_is_contained(hostile_results, name):
  _, expected_status, error_part, stdout_check = HOSTILE[name]
  result, ended = hostile_results[0][name]
  assert result.status == expected_status, (result.error, result.stdout, result.stderr)
  assert re.search(error_part, result.error + result.stderr), (result.error, result.stderr)
  assert result.tests_passed < 3 or not result.complete
  assert result.fraction < 1.0 and not result.passed
  if stdout_check is not None:
    assert stdout_check(result.stdout), result.stdout
  assert len(result.stdout) <= LIMITS.max_output_bytes
  assert len(result.stderr) <= LIMITS.max_output_bytes
  assert result.pid_namespace is not None
  assert not _leftover_processes(result.pid_namespace, ended)


def test_hostile_suite_is_large_enough():
  assert len(HOSTILE) >= 20


def test_runs_next_to_hostile_programs_still_pass(hostile_results):
  assert [r.status for r in hostile_results[1]] == ["passed"] * len(HOSTILE)


def _attack_task(name):
  task = ATTACKS[name][0]
  return TASKS[task] if task in TASKS else next(t for t in humaneval_tasks() if t.id == task)


@pytest.fixture(scope="module")
def attack_results(box):
  return dict(zip(ATTACKS, box.run_many([job_for(_attack_task(n), ATTACKS[n][1])
                                         for n in ATTACKS])))


@pytest.mark.parametrize("name", list(ATTACKS))
def test_tampering_scores_zero(attack_results, name):
  """Each attack passes every test where the program and the tests share an interpreter."""
  result = attack_results[name]
  assert result.status in ("failed", "timeout", "crash"), (result.error, result.stderr)
  assert result.tests_passed == 0 and result.fraction == 0.0 and not result.passed, (
      result.outcomes)


def test_tampering_suite_is_large_enough():
  assert len(ATTACKS) >= 12


@pytest.mark.parametrize("task,program", [
    ("add", GOOD_ADD), ("square_unittest", "def square(x):\n    return x * x\n"),
    ("square_script", "def square(x):\n    return x * x\n")])
def test_tampering_tasks_pass_honest_programs(box, task, program):
  assert box.run(job_for(TASKS[task], program)).status == "passed"


def test_nothing_left_on_the_host(hostile_results):
  del hostile_results  # the hostile programs wrote MARKER files in /sandbox and /tmp
  for path in ("/tmp/" + MARKER, "/sandbox", "/dev/shm/" + MARKER, str(REPO / MARKER)):
    assert not os.path.exists(path), path


def test_correct_program_passes(box):
  result = box.run(sb.Job(GOOD_ADD + "print('hello')\n", ADD_TESTS, "add"))
  assert result.status == "passed" and result.complete
  assert (result.tests_run, result.tests_passed, result.tests_total) == (3, 3, 3)
  assert result.fraction == 1.0 and result.stdout == "hello\n"


def test_partial_program_gets_per_test_counts(box):
  program = "def add(a, b):\n    return a + b if a > 0 else 99\n"
  result = box.run(sb.Job(program, ADD_TESTS, "add"))
  assert result.status == "failed" and result.complete
  assert (result.tests_run, result.tests_passed, result.tests_total) == (3, 2, 3)
  assert result.fraction == pytest.approx(2 / 3)
  assert result.outcomes[0] == "pass" and result.outcomes[2] == "pass"
  assert result.outcomes[1].startswith("fail: assert candidate(-1, 1) == 0 -> AssertionError")


def test_setup_error_midway_keeps_earlier_tests_and_skips_the_rest(box):
  tests = ("def check(candidate):\n    assert candidate(1, 2) == 3\n"
           "    table = {}[candidate(0, 0)]\n    assert candidate(2, 2) == 4\n")
  result = box.run(sb.Job(GOOD_ADD, tests, "add"))
  assert result.status == "failed" and result.complete
  assert result.outcomes == ("pass", "skip")
  assert (result.tests_run, result.tests_passed) == (1, 1)
  assert "KeyError" in result.error


def test_assert_list_and_script_and_unittest_formats(box):
  asserts = ("assert add(1, 2) == 3", "assert add(2, 2) == 5", "x = add(0, 0)\nassert x == 0")
  r = box.run(sb.Job(GOOD_ADD, asserts))
  assert (r.status, r.tests_passed, r.tests_total) == ("failed", 2, 3)
  script = "import math\nassert add(1, 2) == 3\ny = add(1, 1)\nassert y == 2\nassert True\n"
  r = box.run(sb.Job(GOOD_ADD, script))
  assert (r.status, r.tests_passed, r.tests_total) == ("passed", 2, 2)
  unit = ("import unittest\nclass T(unittest.TestCase):\n"
          "    def test_a(self):\n        self.assertEqual(add(1, 2), 3)\n"
          "    def test_b(self):\n        self.assertEqual(add(1, 1), 3)\n"
          "    def helper(self):\n        pass\n")
  r = box.run(sb.Job(GOOD_ADD, unit))
  assert (r.status, r.tests_run, r.tests_passed, r.tests_total) == ("failed", 2, 1, 2)
  assert "AssertionError" in r.outcomes[1]


def test_timeout_midway_counts_nothing(box):
  program = "def add(a, b):\n    while a < 0:\n        pass\n    return a + b\n"
  r = box.run(sb.Job(program, ADD_TESTS, "add"))
  assert r.status == "timeout" and not r.complete
  assert r.tests_passed == 1 and r.fraction == 0.0


def test_calls_carry_plain_data_and_builtin_errors(box):
  """Values cross by exact type; errors come back as the nearest builtin Exception type."""
  program = ("class Odd(ValueError):\n    pass\n"
             "LIMIT = {'big': 10 ** 40, 'pair': (1.5, -0j), 'raw': b'\\x00'}\n"
             "def echo(x, **k):\n    return [x, k]\n"
             "def fail(kind):\n    raise {'odd': Odd('no'), 'exit': SystemExit(3)}[kind]\n"
             "def grab(xs):\n    xs.append(1)\n    return len(xs)\n"
             "def lazy():\n    return (i for i in range(3))\n")
  tests = ("import unittest\nclass T(unittest.TestCase):\n"
           "    def test_round_trip(self):\n"
           "        v = [None, True, 3, 2.5, 'é', b'b', (1, [2]), {1: 'a'}, {3}, frozenset({4}),\n"
           "             -(2 ** 80), float('inf'), 1 + 2j]\n"
           "        out = echo(v, key={'k': (1,)})\n"
           "        self.assertEqual(out, [v, {'key': {'k': (1,)}}])\n"
           "        self.assertEqual([type(x) for x in out[0]], [type(x) for x in v])\n"
           "    def test_constant(self):\n"
           "        self.assertEqual(LIMIT, {'big': 10 ** 40, 'pair': (1.5, -0j), 'raw': b'\\0'})\n"
           "    def test_builtin_ancestor(self):\n"
           "        with self.assertRaisesRegex(ValueError, 'Odd: no'):\n            fail('odd')\n"
           "    def test_exit_is_no_builtin_exception(self):\n"
           "        with self.assertRaises(Exception) as caught:\n            fail('exit')\n"
           "        self.assertEqual(type(caught.exception).__name__, 'ProgramError')\n"
           "    def test_arguments_go_by_value(self):\n        xs = []\n"
           "        self.assertEqual(grab(xs), 1)\n        self.assertEqual(xs, [])\n"
           "    def test_generator_is_not_plain(self):\n"
           "        with self.assertRaisesRegex(Exception, 'not plain data'):\n            lazy()\n"
           "    def test_function_argument_is_not_plain(self):\n"
           "        with self.assertRaisesRegex(Exception, 'not plain data'):\n"
           "            echo(len)\n")
  r = box.run(sb.Job(program, tests))
  assert r.status == "passed", r.outcomes


def test_calls_from_test_threads_do_not_mix(box):
  tests = ("import threading\nout = {}\n"
           "def work(k):\n    out[k] = [add(k, i) for i in range(40)]\n"
           "threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]\n"
           "for t in threads:\n    t.start()\nfor t in threads:\n    t.join()\n"
           "assert out == {k: [k + i for i in range(40)] for k in range(4)}\n")
  assert box.run(sb.Job(GOOD_ADD, tests)).status == "passed"


def test_context_names_are_the_tests_own(box):
  """Helpers given by the task come from the context; the program's version is never used."""
  context = "def double(x):\n    return 2 * x\n"
  tests = "def check(candidate):\n    assert candidate(3) == double(3)\n"
  honest = "def double(x):\n    return 2 * x\ndef f(x):\n    return double(x)\n"
  lying = "def double(x):\n    return 0\ndef f(x):\n    return 0\n"
  assert box.run(sb.Job(honest, tests, "f", context=context)).status == "passed"
  assert box.run(sb.Job(lying, tests, "f", context=context)).status == "failed"
  assert box.run(sb.Job(lying, tests, "f")).status == "passed"  # without the context


def test_entry_point_may_shadow_a_builtin_other_names_may_not(box):
  program = "def max(xs):\n    return min(xs)\nabs = lambda x: 0\n"
  tests = ("assert max([1, 3]) == 1\n", "assert abs(-2) == 2\n")
  r = box.run(sb.Job(program, tests, "max"))
  assert r.status == "passed", r.outcomes


def test_both_processes_are_confined(box):
  """Neither the program process nor the tests' process can fork (seccomp in each)."""
  program = ("import os\ntry:\n    os.fork()\n    FORKED = True\n"
             "except PermissionError:\n    FORKED = False\n")
  tests = ("assert FORKED is False\n",
           "import os\ntry:\n    os.fork()\nexcept PermissionError:\n    pass\n"
           "else:\n    os._exit(0)\nassert os.getpid() == 1\n")
  r = box.run(sb.Job(program, tests))
  assert r.status == "passed" and r.tests_total == 2, r.outcomes


def test_limits_validate():
  with pytest.raises(ValueError, match="wall_seconds"):
    sb.Limits(wall_seconds=0)
  with pytest.raises(ValueError, match="max_open_files"):
    sb.Limits(max_open_files=4)


def test_broken_launch_is_sandbox_error():
  interp = launch.interpreter(None)
  launcher = launch.Bwrap(dataclasses.replace(interp, exe="/opt/python/bin/no-such-python"))
  job = sb.Job(GOOD_ADD, ADD_TESTS, "add")
  r = supervise.execute(launcher, sb.plan_tests(ADD_TESTS, "add"), job, LIMITS)
  assert r.status == "sandbox_error" and "did not start" in r.error


def test_unavailable_backend_raises():
  with pytest.raises(sb.SandboxUnavailableError):
    sb.Sandbox(backend="bwrap", python="/no/such/python")


def test_auto_refuses_instead_of_falling_back(monkeypatch):
  def no_unshare(*_):
    raise AssertionError("auto must never try the unshare launcher")
  monkeypatch.setattr(launch, "_LAUNCHERS", {})
  monkeypatch.setattr(launch, "bwrap_binary", lambda: None)
  monkeypatch.setattr(launch, "Unshare", no_unshare)
  with pytest.raises(sb.SandboxUnavailableError, match="no bwrap binary.*backend='unshare'"):
    sb.Sandbox()


@pytest.mark.skipif(not (os.path.exists("/usr/bin/python3") and launch.which("unshare")),
                    reason="the unshare test needs /usr/bin/python3 and util-linux unshare")
def test_unshare_runs_by_name_with_a_warning():
  with pytest.warns(RuntimeWarning, match="WITHOUT filesystem isolation"):
    weaker = sb.Sandbox(LIMITS, workers=1, backend="unshare",
                          python=os.path.realpath("/usr/bin/python3"))
  assert weaker.backend == "unshare"
  assert weaker.run(sb.Job(GOOD_ADD, ADD_TESTS, "add")).status == "passed"
  program = ("import os, socket\nprint('CWD', os.getcwd(), os.getuid(), flush=True)\n"
             "socket.create_connection(('127.0.0.1', %d), timeout=1)\n" % HOST_PORT)
  r = weaker.run(sb.Job(program, ADD_TESTS, "add"))
  assert r.status == "failed" and ("ConnectionRefused" in r.error or "unreachable" in r.error)
  workdir = r.stdout.split()[1]
  assert workdir.startswith("/tmp/rlcode-sandbox-") and not os.path.exists(workdir)
  assert r.stdout.split()[2] == "65534"
  # The harness installs the seccomp filter itself, under unshare too.
  r = weaker.run(sb.Job("import os\nwhile True:\n    os.fork()\n", ADD_TESTS, "add"))
  assert r.status == "failed" and "PermissionError" in r.error
