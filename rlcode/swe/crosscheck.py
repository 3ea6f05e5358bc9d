"""The second runner: each test in a fresh process whose verdict its parent reads.

Validation's cross-check of the FAIL_TO_PASS tests of a gold patch (rlcode.swe.validate).
pytest's report (rlcode.swe.runner) is written from inside the interpreter that runs the
code under test, so that code can rewrite it: patch `_pytest.reports.TestReport`, wrap
the report plugin's emitter, rewrite outcomes in a conftest's hook, write a report file
of its own and end the interpreter before the real one. `run(spec)` runs each of
`spec.tests` (node ids) again, in a sandbox of its own, without pytest's reports:

  - a driver (the sandbox's command, init's child in its pid namespace, standard
    library only, `-I` so that no file of the tree can stand in for a module it
    imports) reads the plan and the tree and deletes them, makes itself non-dumpable
    (no process of the tree can read its memory, file descriptors or environment
    through /proc) and the subreaper of what the tests leave, and for each test unpacks
    the tree anew (what one test's run wrote in the tree cannot change the next one's
    files; /tmp, the sandbox's own, is kept), starts one interpreter, waits for it,
    then sends SIGKILL to every process but itself and init and reaps them, again until
    /proc lists no other (a process that forks in a loop is not missed by one scan); a
    process it cannot end stops the run;
  - that interpreter first compiles the test's def from the fresh file (`find`: its
    qualified name and first line) and traces the call: a verdict of "returned" needs that
    code, equal in value to the module's own, to have reached a return instruction, so
    whatever replaces, wraps or skips the function the runner calls does not pass. It gets
    two pipes: the driver writes a fresh random key into one, and the interpreter reads it
    only after the call has returned (or raised) and writes it back on the other with the
    word "returned" (or "raised"), then exits 0. The driver trusts only that: an
    interpreter that exits early (`os._exit(0)` at import or in the test, `sys.exit`), is
    killed, or writes anything else gives no verdict ("error"), whatever its exit status;
  - the driver prints its verdicts, one letter a test and a nonce from the plan it deleted
    before any test ran, on its standard output, which no test process holds or can open.

Which tests run how (`route` in rlcode.swe.routing, decided from the tree's text, never
from what a test process says): "direct" — a module-level test function or a method of a
class, found as a `def` in the file, taking no argument (besides self) but those one
hypothesis `given` supplies, with no decorator but hypothesis's, in a module and class
without pytest marks, autouse fixtures or xunit setup, and no conftest.py on the way from
the root — is imported and called by a few lines of ours that never import pytest
(hypothesis is made deterministic by the report plugin's function, its text copied;
pytest's import mode "prepend"; a unittest.TestCase runs through
`unittest.TestSuite([case]).debug()`, its setUp and class fixtures included). Every other
test (parametrized ids, fixtures, marks, conftest.py) runs in pytest, alone
(`pytest.main` on its function, the other items deselected, `--assert=plain` so that the
module's code is the file's), with a plugin object whose wrapper traces the call phase:
the verdict is whether that phase returned with the test's own code returned, never
pytest's report, so a hook that rewrites reports, a patched TestReport, a
`pytest_pyfunc_call` that never calls the test, a Function.setup or setup hook that swaps
`item.obj`, or a wrapper that swallows the test's exception does not pass. Only the last
run of the test's code counts (hypothesis runs it once an example and replays a failing
one last), so a wrapper that swallows a failure after a pass does not pass either, and
the verdict needs the call phase of the selected test alone (an item put back after the
selection gives none). A unittest.TestCase test in the pytest route gets no verdict
(pytest's unittest item records a failure instead of raising it), nor does a test whose
def its file does not show (made by a factory, imported, inherited from another module):
such a task is dropped.

What remains possible (counted in tests/test_swe_forgery.py as the known limits). The
test and the code under test still run in the interpreter that reads the key and traces
the call, so code written against this runner can forge it: read the key pipe during the
call and write the verdict itself, end or replace the trace function, or run the test's
own code with other globals, arguments or fixture values (a function built from its code
object, `types.FunctionType(code, forged_globals)`, is equal in code and passes the
check). Code that recognises this runner (no pytest in sys.modules, the driver as parent)
can also behave correctly here and wrong elsewhere. And a test is only as good as its
assertions: a lying `__eq__` passes both runners. What this closes is every forgery that
targets pytest (its reports, hooks, exit status, the report plugin or file, which function
it calls) or ends the interpreter, and a process left behind to change a later test: to
pass, a forgery must know this protocol and defeat it in a second interpreter that starts
from a fresh copy of the tree.

Time: `seconds(spec)`, spec.timeout and PER_TEST_SECONDS a test; a run that runs out of
it is "timeout" (validation skips the PR as such, and the cache does not keep it).

Cost: one sandbox and one interpreter per test (about 0.05 s a direct test and 0.3 s a
pytest one on an idle core, plus the test itself); validation runs it on the gold patch's
FAIL_TO_PASS tests only (rlcode.swe.mining).

This module must not know about PRs, tasks or rewards.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import secrets
import shlex
import time

from rlcode.sandbox.session import Session, SessionError
from rlcode.swe import runner, testenv
from rlcode.swe.routing import find, route
from rlcode.swe.runner import RunSpec, TestRun

CROSSCHECK_VERSION = "3"  # bump when a change here changes verdicts (it keys the cache)
# The driver's letters: the function returned, raised, or the budget ran out before the
# test did; "n" (no verdict) and anything else is "error".
LETTERS = {"r": "passed", "x": "failed", "t": "error"}
# Each test's allowance on top of spec.timeout: its tree unpacked, its interpreter
# started, pytest imported (about 0.3 s on an idle core).
PER_TEST_SECONDS = 2.0
# How long the driver keeps killing what a test left before it gives up on the run.
KILL_SECONDS = 10
_PLAN = ".rlcode_crosscheck.json"
_TREE = ".rlcode_crosscheck.b64"

# What both kinds of interpreter start with. argv: the node id, the verdict pipe, the key
# pipe, and the qualified name and first line of the test's def in its file (`find`). The
# def is compiled from the fresh copy of the file before any of the tree's code runs; a
# trace function sees whether that code (equal in value, so the module's own function)
# ran to a return instruction, so whatever replaces or wraps the function the runner
# calls cannot pass without the test's own code returning. The functions needed after the
# call are bound first, so a module that replaces os.write or sys.settrace afterwards does
# not change how the verdict is seen or written; they come from the standard library alone
# (the tree and the test environment join sys.path after these imports), so no file of
# the tree runs before them.
_PRELUDE = """\
import sys
_path = sys.path[:]
sys.path[:] = [p for p in _path if p and not p.startswith(("/sandbox", """ + repr(
    testenv.MOUNT) + """))]
import dis, os, unittest
sys.path[:] = _path
_read, _write, _exit, _settrace = os.read, os.write, os._exit, sys.settrace
node, res, key, qualname, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
_RETURNS = frozenset(dis.opmap[n] for n in ("RETURN_VALUE", "RETURN_CONST") if n in dis.opmap)


def _expected():
  path = node.split("::")[0]
  with open(path, "rb") as f:
    todo = [compile(f.read(), os.path.abspath(path), "exec", dont_inherit=True)]
  while todo:
    code = todo.pop()
    if code.co_qualname == qualname and code.co_firstlineno == first:
      return code
    todo.extend(c for c in code.co_consts if isinstance(c, type(code)))
  return None


_want = _expected()
_name = qualname.rsplit(".", 1)[-1]
_returned = []


def _local(frame, event, arg):
  if event == "return" and frame.f_code.co_code[frame.f_lasti] in _RETURNS:
    _returned.append(True)
  return _local


def _tracer(frame, event, arg):
  code = frame.f_code
  if code.co_name == _name and code == _want:
    # Only the last run of the test's code counts: hypothesis runs it once an example and
    # replays the failing one last, so a wrapper that swallows that failure has no return.
    _returned.clear()
    return _local
  return None
"""

def _plugin_function(name: str) -> str:
  """The text of the report plugin's function `name` (rlcode.swe.pytest_plugin)."""
  module = ast.parse(testenv.PLUGIN_SOURCE)
  found = next(s for s in module.body if isinstance(s, ast.FunctionDef) and s.name == name)
  return ast.get_source_segment(testenv.PLUGIN_SOURCE, found)


# A direct test's interpreter (after the prelude). Hypothesis is made deterministic by
# the report plugin's own function, its text copied here so that pytest is never imported.
_DIRECT = _PRELUDE + """\
_EXAMPLES = os.environ.pop("RLCODE_HYPOTHESIS_EXAMPLES", "")
%(deterministic)s


def target():
  import importlib, unittest
  path, *names = node.split("::")
  base, parts = os.path.dirname(os.path.abspath(path)), [os.path.basename(path)[:-3]]
  while os.path.isfile(os.path.join(base, "__init__.py")):
    parts.insert(0, os.path.basename(base))
    base = os.path.dirname(base)
  sys.path.insert(0, base)
  module = importlib.import_module(".".join(parts))
  deterministic_hypothesis()
  if len(names) == 1:
    return getattr(module, names[0])
  cls = getattr(module, names[0])
  if isinstance(cls, type) and issubclass(cls, unittest.TestCase):
    return unittest.TestSuite([cls(names[1])]).debug
  return getattr(cls(), names[1])


try:
  call = target()
  _settrace(_tracer)
  try:
    call()
  finally:
    _settrace(None)
  word = b" returned\\n" if _returned else None
except BaseException:
  word = b" raised\\n"
if word:
  _write(res, _read(key, 64) + word)
_exit(0)
""" % {"deterministic": _plugin_function("deterministic_hypothesis")}

# A test that needs pytest (after the prelude): pytest.main on its function alone, with
# asserts left as written (so that the module's code is what the prelude compiled) and a
# plugin object whose wrapper around the call phase traces it: the verdict is whether the
# call phase returned with the test's own code returned, or raised, never pytest's report.
# A unittest.TestCase test gets none: pytest's unittest item records a failure instead of
# raising it, so a return does not say the test passed.
_PYTEST = _PRELUDE + """\
import pytest


class Watch:
  def __init__(self):
    self.seen = None
    self.items = 0
    self.called = []

  @pytest.hookimpl(trylast=True)
  def pytest_collection_modifyitems(self, items):
    items[:] = [item for item in items if item.nodeid == node]
    self.items = len(items)

  @pytest.hookimpl(wrapper=True, tryfirst=True)
  def pytest_runtest_call(self, item):
    self.called.append(item.nodeid)  # an item put back after the selection: no verdict
    cls = getattr(item, "cls", None)
    self.seen = "raised"
    _settrace(_tracer)
    try:
      result = yield
    finally:
      _settrace(None)
    unit = isinstance(cls, type) and issubclass(cls, unittest.TestCase)
    self.seen = "returned" if _returned and not unit else None
    return result


watch = Watch()
try:
  pytest.main(["-p", "rlcode_pytest_report", "-p", "no:cacheprovider", "--rootdir=/sandbox",
               "-q", "--no-header", "-o", "console_output_style=classic", "--tb=no",
               "--assert=plain", node.split("[", 1)[0]], plugins=[watch])
except BaseException:
  watch.seen = None
if watch.items == 1 and watch.called == [node] and watch.seen:
  _write(res, _read(key, 64) + b" " + watch.seen.encode() + b"\\n")
_exit(0)
"""

# The driver (module docstring). Its verdicts go to its standard output, which no test
# process holds (theirs is /dev/null) or can open (the driver is non-dumpable); one letter
# a test, in the plan's order (LETTERS).
_DRIVER = runner.UNPACK_FUNCTION + """
import base64, ctypes, json, os, secrets, signal, subprocess, sys, time
plan = json.load(open(%(plan)r))
data = base64.b64decode(open(%(tree)r).read())
os.remove(%(plan)r)
os.remove(%(tree)r)
nonce = plan["nonce"]
libc = ctypes.CDLL(None)


def report(letters, why=""):
  sys.stdout.write(json.dumps({"n": nonce, "v": letters, "why": why}) + "\\n")
  sys.stdout.flush()
  sys.exit(0)


def wipe(path):
  for entry in os.scandir(path):
    if entry.is_dir(follow_symlinks=False):
      os.chmod(entry.path, 0o700)
      wipe(entry.path)
      os.rmdir(entry.path)
    else:
      os.unlink(entry.path)


def others():
  return [n for n in os.listdir("/proc") if n.isdigit() and int(n) not in (1, os.getpid())]


def kill_others():
  # kill(-1) reaches every process of the namespace but the caller and init, and a fork
  # racing it either is reached or fails; orphans come to this process (a subreaper),
  # which reaps them, until /proc lists no other process. Bounded in time, not rounds (a
  # large process takes a while to die on a busy machine): False if one stays.
  until = time.monotonic() + %(kill_seconds)d
  while time.monotonic() < until:
    try:
      os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
      pass
    while True:
      try:
        if os.waitpid(-1, os.WNOHANG)[0] == 0:
          break
      except ChildProcessError:
        break
    if not others():
      return True
    time.sleep(0.01)
  return False


def nested_pid_namespace():
  # The initial pid namespace has a fixed inode (the kernel's PROC_PID_INIT_INO); in any
  # other, kill(-1) reaches only that namespace's processes. Init as parent: the driver
  # is the session's command, nothing of the host beside it.
  try:
    ns = os.readlink("/proc/self/ns/pid")
  except OSError:
    return False
  return ns.startswith("pid:[") and ns != "pid:[4026531836]" and os.getppid() == 1


letters = ""
if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
  report(letters, "the driver could not make itself non-dumpable")
if not nested_pid_namespace() or libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
  report(letters, "the driver is not init's child in a pid namespace of its own")
if others():
  report(letters, "another process runs beside the driver")
deadline = time.monotonic() + plan["seconds"]
env = dict(os.environ, **plan["env"])
for node, route, qualname, first in plan["tests"]:
  left = deadline - time.monotonic()
  if left <= 0:
    letters += "t"
    continue
  if qualname is None:
    letters += "n"
    continue
  wipe(".")
  unpack(data)
  given = secrets.token_hex(16).encode()
  res_r, res_w = os.pipe()
  key_r, key_w = os.pipe()
  os.write(key_w, given)
  os.close(key_w)
  proc = subprocess.Popen(["python3", "-S", "-c", plan["children"][route], node,
                           str(res_w), str(key_r), qualname, str(first)],
                          pass_fds=(res_w, key_r), stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                          start_new_session=True)
  os.close(res_w)
  os.close(key_r)
  try:
    code = proc.wait(left)
  except subprocess.TimeoutExpired:
    code = None
  ended = kill_others()
  os.set_blocking(res_r, False)
  try:
    got = os.read(res_r, 256)
  except BlockingIOError:
    got = b""
  os.close(res_r)
  if code is None:
    letters += "t"
  elif code == 0 and got == given + b" returned\\n":
    letters += "r"
  elif code == 0 and got == given + b" raised\\n":
    letters += "x"
  else:
    letters += "n"
  if not ended:
    report(letters, "a test left a process that SIGKILL did not end")
report(letters)
""" % {"plan": _PLAN, "tree": _TREE, "kill_seconds": KILL_SECONDS}


def plan(spec: RunSpec) -> list[list]:
  """[node id, route, qualified name, first line] of each of spec.tests, in order (`route`,
  `find`; a test whose def is not found gets None and 0, and no verdict)."""
  out = []
  for node in spec.tests:
    qualname, first = find(spec.files, node) or (None, 0)
    out.append([node, route(spec.files, node), qualname, first])
  return out


def seconds(spec: RunSpec) -> float:
  """The driver's wall clock for spec: spec.timeout (what the tests take) and
  PER_TEST_SECONDS a test (its unpack, its interpreter, pytest's import)."""
  return spec.timeout + PER_TEST_SECONDS * len(spec.tests)


def parse(text: str, nonce: str, tests: tuple[str, ...]) -> tuple[dict[str, str], str, str]:
  """(node id -> outcome, status, why the driver stopped or "") of the driver's output:
  its line with the nonce, one letter a test of `tests` in order (LETTERS; any other is
  "error", and so is a test listed twice). Status "ok" when every test has a verdict
  letter, "timeout" when the budget ran out before one, else "crash"."""
  for line in text.splitlines():
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if (isinstance(record, dict) and record.get("n") == nonce
        and isinstance(record.get("v"), str) and isinstance(record.get("why"), str)):
      break
  else:
    return {}, "crash", ""
  letters, why = record["v"][:len(tests)], record["why"][:200]
  outcomes: dict[str, str] = {}
  for test, letter in zip(tests, letters):
    outcomes[test] = "error" if test in outcomes else LETTERS.get(letter, "error")
  status = "timeout" if "t" in letters else (
      "ok" if len(letters) == len(tests) and not why else "crash")
  return outcomes, status, why


def run(spec: RunSpec, env: testenv.TestEnv | None = None) -> TestRun:
  """Each of spec.tests in its own interpreter (module docstring): outcomes "passed" (the
  test function returned), "failed" (it raised) or "error" (no verdict); status "ok" when
  the driver gave every test a verdict, "timeout" when `seconds(spec)` ran out first.
  Never raises for what the tests do."""
  env = env or runner.environment(spec)
  nonce = secrets.token_hex(16)
  children = {"direct": _DIRECT, "pytest": _PYTEST}
  child_env = {"PYTHONPATH": runner.python_path(spec), "PYTHONHASHSEED": str(spec.attempt)}
  if spec.hypothesis_examples:
    child_env["RLCODE_HYPOTHESIS_EXAMPLES"] = str(spec.hypothesis_examples)
  budget = seconds(spec)
  todo = {"nonce": nonce, "seconds": budget, "env": child_env, "children": children,
          "tests": plan(spec)}
  limits = dataclasses.replace(runner.session_limits(spec), command_seconds=budget + 30,
                               cpu_seconds=int(budget) + 1,
                               max_output_bytes=len(spec.tests) + (8 << 10))
  start = time.monotonic()
  try:
    with Session(limits, mounts={testenv.MOUNT: env.path}) as session:
      session.write(_TREE, runner.tarball(spec.files))
      session.write(_PLAN, json.dumps(todo))
      result = session.exec(f"exec python3 -S -I -c {shlex.quote(_DRIVER)}",
                            timeout=budget + 30)
  except SessionError as e:
    return TestRun("crash", output=f"the session died: {e}"[-2000:],
                   seconds=time.monotonic() - start)
  outcomes, status, why = parse(result.output, nonce, spec.tests)
  if status == "crash" and result.timed_out:
    status = "timeout"
  elif status == "crash" and why:  # the driver stopped for its sandbox's sake: no cache
    status = "sandbox_error"
  return TestRun(status, outcomes, {}, 0 if status == "ok" else None,
                 time.monotonic() - start, why or result.output[-2000:])


def cached(tests: runner.Runner, spec: RunSpec) -> TestRun:
  """`run(spec)` through `tests`' cache; a run that timed out is not kept (on a less
  loaded machine it may finish)."""
  return tests.run(spec, run, f"crosscheck {CROSSCHECK_VERSION}", cache_timeouts=False)
