"""The second runner: each test in a fresh process whose verdict its parent reads.

Validation's cross-check of the FAIL_TO_PASS tests of a gold patch (rlcode.swe.validate).
pytest's report (rlcode.swe.runner) is written from inside the interpreter that runs the
code under test, so that code can rewrite it: patch `_pytest.reports.TestReport`, wrap
the report plugin's emitter, rewrite outcomes in a conftest's hook, write a report file
of its own and end the interpreter before the real one. `run(spec)` runs each of
`spec.tests` (node ids) again, in a sandbox of its own, without pytest's reports:

  - a driver (the sandbox's first process, standard library only, `-I` so that no file of
    the tree can stand in for a module it imports) reads the plan and the tree and deletes
    them, makes itself non-dumpable (no process of the tree can read its memory, file
    descriptors or environment through /proc), and for each test unpacks the tree anew (what
    one test's run wrote cannot change the next one's files), starts one interpreter, waits
    for it, then kills every process but itself and the sandbox's init;
  - that interpreter gets two pipes: the driver writes a fresh random key into one, and
    the interpreter reads it only after the test function has returned (or raised) and
    writes it back on the other with the word "returned" (or "raised"), then exits 0. The
    driver trusts only that: an interpreter that exits early (`os._exit(0)` at import or in
    the test, `sys.exit`), is killed, or writes anything else gives no verdict ("error"),
    whatever its exit status;
  - the driver writes its verdicts to a file once every test's processes are dead, each
    line with a nonce from the plan it deleted before any test ran, so no line a test
    writes counts.

Which tests run how (`route`, decided here from the tree's text, never from what a test
process says): "direct" — a module-level test function or a method of a class, found as
a `def` in the file, taking no argument (besides self) unless hypothesis' `given` supplies
them, with no decorator but hypothesis's, in a module and class without pytest marks,
autouse fixtures or xunit setup, and no conftest.py on the way from the root — is imported and
called by a few lines of ours that never import pytest (pytest's import mode "prepend";
a unittest.TestCase runs through `unittest.TestSuite([case]).debug()`, its setUp and
class fixtures included). Every other test (parametrized ids, fixtures, marks, conftest.py)
runs in pytest, alone (`pytest.main` on its function, the other items deselected), with a
plugin object of ours that wraps the item's function: the verdict is whether that wrapper
saw the function return, never pytest's report of it, so a hook that rewrites reports,
a patched TestReport or a `pytest_pyfunc_call` that never calls the test does not pass.

What remains possible (counted in tests/test_swe_forgery.py as the known limits). The
test and the code under test still run in the interpreter that reads the key, so code
written against this runner can forge it: read the key pipe during the call and write
the verdict itself, or (in the pytest route) call the test's original function from a
conftest hook and swallow its exception. Code that recognises this runner (no pytest in
sys.modules, the driver as parent) can also behave correctly here and wrong elsewhere. And
a test is only as good as its assertions: a lying `__eq__` passes both runners. What this
closes is every forgery that targets pytest (its reports, hooks, exit status, the report
plugin or file) or ends the interpreter: to pass, a forgery must also know this protocol
and defeat it in a second interpreter that starts from a fresh copy of the tree.

Cost: one sandbox and one interpreter per test (about 0.05 s a direct test and 0.3 s a
pytest one on an idle core, plus the test itself); validation runs it on the gold patch's
FAIL_TO_PASS tests only (rlcode.swe.mining).

This module must not know about PRs, tasks or rewards.
"""

from __future__ import annotations

import ast
import json
import posixpath
import secrets
import shlex
import time
from collections.abc import Mapping

from rlcode.sandbox.session import Session, SessionError
from rlcode.swe import runner, testenv
from rlcode.swe.runner import RunSpec, TestRun

CROSSCHECK_VERSION = "1"  # bump when a change here changes verdicts (it keys the cache)
ROUTES = ("direct", "pytest")
VERDICTS = {"returned": "passed", "raised": "failed"}  # anything else is "error"
_PLAN = ".rlcode_crosscheck.json"
_TREE = ".rlcode_crosscheck.b64"
_OUT = ".rlcode_crosscheck.out"
_HYPOTHESIS = frozenset({"given", "settings", "example", "seed"})
_XUNIT = frozenset({"setup_module", "teardown_module", "setUpModule", "tearDownModule",
                    "setup_function", "teardown_function", "setup_method", "teardown_method",
                    "setup_class", "teardown_class", "setup", "teardown"})

# A direct test's interpreter: argv is the node id, the verdict pipe and the key pipe. The
# functions it needs after the call are bound before the test's module is imported, so a
# module that replaces os.write does not change how the verdict is written.
_DIRECT = """\
import os, sys
_read, _write, _exit = os.read, os.write, os._exit
node, res, key = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def call():
  import importlib, unittest
  path, *names = node.split("::")
  base, parts = os.path.dirname(os.path.abspath(path)), [os.path.basename(path)[:-3]]
  while os.path.isfile(os.path.join(base, "__init__.py")):
    parts.insert(0, os.path.basename(base))
    base = os.path.dirname(base)
  sys.path.insert(0, base)
  module = importlib.import_module(".".join(parts))
  if "hypothesis" in sys.modules:
    import rlcode_pytest_report
    rlcode_pytest_report.deterministic_hypothesis()
  if len(names) == 1:
    getattr(module, names[0])()
    return
  cls = getattr(module, names[0])
  if isinstance(cls, type) and issubclass(cls, unittest.TestCase):
    unittest.TestSuite([cls(names[1])]).debug()
  else:
    getattr(cls(), names[1])()


try:
  call()
  word = b" returned\\n"
except BaseException:
  word = b" raised\\n"
_write(res, _read(key, 64) + word)
_exit(0)
"""

# A test that needs pytest: pytest.main on its function alone, with a plugin object that
# wraps the item's function just before pytest calls it.
_PYTEST = """\
import os, sys
_read, _write, _exit = os.read, os.write, os._exit
node, res, key = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import inspect
import pytest


class Watch:
  def __init__(self):
    self.seen = None
    self.items = 0

  @pytest.hookimpl(trylast=True)
  def pytest_collection_modifyitems(self, items):
    items[:] = [item for item in items if item.nodeid == node]
    self.items = len(items)

  @pytest.hookimpl(tryfirst=True)
  def pytest_runtest_call(self, item):
    function, watch = item.obj, self

    if inspect.iscoroutinefunction(function):
      async def watched(*args, **kwargs):
        watch.seen = "raised"
        result = await function(*args, **kwargs)
        watch.seen = "returned"
        return result
    else:
      def watched(*args, **kwargs):
        watch.seen = "raised"
        result = function(*args, **kwargs)
        watch.seen = "returned"
        return result
    item.obj = watched


watch = Watch()
try:
  pytest.main(["-p", "rlcode_pytest_report", "-p", "no:cacheprovider", "--rootdir=/sandbox",
               "-q", "--no-header", "-o", "console_output_style=classic", "--tb=no",
               node.split("[", 1)[0]], plugins=[watch])
except BaseException:
  watch.seen = None
if watch.items == 1 and watch.seen:
  _write(res, _read(key, 64) + b" " + watch.seen.encode() + b"\\n")
_exit(0)
"""

# The driver (module docstring). argv: the workspace's path.
_DRIVER = runner.UNPACK_FUNCTION + """
import base64, ctypes, json, os, secrets, signal, subprocess, sys, time
plan = json.load(open(%(plan)r))
data = base64.b64decode(open(%(tree)r).read())
os.remove(%(plan)r)
os.remove(%(tree)r)
nonce = plan["nonce"]


lines = []


def say(record):
  record["n"] = nonce
  lines.append(json.dumps(record) + "\\n")


def report():
  with open(%(out)r, "w") as f:
    f.write("".join(lines))


def wipe(path):
  for entry in os.scandir(path):
    if entry.is_dir(follow_symlinks=False):
      os.chmod(entry.path, 0o700)
      wipe(entry.path)
      os.rmdir(entry.path)
    else:
      os.unlink(entry.path)


def kill_others():
  for name in os.listdir("/proc"):
    if name.isdigit() and int(name) not in (1, os.getpid()):
      try:
        os.kill(int(name), signal.SIGKILL)
      except OSError:
        pass


try:
  dumpable = ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0  # PR_SET_DUMPABLE
except (OSError, AttributeError):
  dumpable = True
if dumpable:
  say({"e": "refused", "why": "the driver could not make itself non-dumpable"})
  report()
  sys.exit(0)
deadline = time.monotonic() + plan["seconds"]
env = dict(os.environ, **plan["env"])
for node, route in plan["tests"]:
  left = deadline - time.monotonic()
  if left <= 0:
    say({"e": "test", "id": node, "v": "timeout"})
    continue
  wipe(".")
  unpack(data)
  given = secrets.token_hex(16).encode()
  res_r, res_w = os.pipe()
  key_r, key_w = os.pipe()
  os.write(key_w, given)
  os.close(key_w)
  proc = subprocess.Popen(["python3", "-S", "-c", plan["children"][route], node,
                           str(res_w), str(key_r)], pass_fds=(res_w, key_r),
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=env, start_new_session=True)
  os.close(res_w)
  os.close(key_r)
  try:
    code = proc.wait(left)
  except subprocess.TimeoutExpired:
    code = None
  kill_others()
  proc.wait()
  os.set_blocking(res_r, False)
  try:
    got = os.read(res_r, 256)
  except BlockingIOError:
    got = b""
  os.close(res_r)
  verdict = "timeout" if code is None else "none"
  if code == 0 and got in (given + b" returned\\n", given + b" raised\\n"):
    verdict = got.split()[1].decode()
  say({"e": "test", "id": node, "v": verdict})
say({"e": "done"})
report()
""" % {"plan": _PLAN, "tree": _TREE, "out": _OUT}


def route(files: Mapping[str, str], node: str) -> str:
  """"direct" or "pytest": how the second runner runs `node` (module docstring)."""
  path, _, rest = node.partition("::")
  names = rest.split("::") if rest else []
  if "[" in node or not 1 <= len(names) <= 2 or path not in files:
    return "pytest"
  parts = path.split("/")[:-1]
  if any(posixpath.join(*parts[:i], "conftest.py") in files for i in range(len(parts) + 1)):
    return "pytest"
  try:
    module = ast.parse(files[path])
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return "pytest"
  if not _plain_scope(module.body):
    return "pytest"
  found = _last_def(module.body, names[0])
  if len(names) == 1:
    return "direct" if _plain_test(found, 0) else "pytest"
  if not isinstance(found, ast.ClassDef) or found.decorator_list or not _plain_scope(found.body):
    return "pytest"
  return "direct" if _plain_test(_last_def(found.body, names[1]), 1) else "pytest"


def _last_def(body: list[ast.stmt], name: str) -> ast.stmt | None:
  """The statement that last binds `name` in `body`, when that is a def or class; None
  when anything else binds it last (an import, an assignment)."""
  last = None
  for stmt in body:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      if stmt.name == name:
        last = stmt
    elif any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
             for n in ast.walk(stmt)) or isinstance(stmt, (ast.Import, ast.ImportFrom)) and any(
                 (a.asname or a.name.split(".")[0]) == name for a in stmt.names):
      last = None
  return last


def _decorator_name(node: ast.expr) -> str:
  node = node.func if isinstance(node, ast.Call) else node
  return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _plain_scope(body: list[ast.stmt]) -> bool:
  """A module or class body without pytest marks, autouse fixtures or xunit setup."""
  for stmt in body:
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
      targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
      if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
        return False
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
      if stmt.name in _XUNIT or any(_autouse(d) for d in stmt.decorator_list):
        return False
  return True


def _autouse(decorator: ast.expr) -> bool:
  """A fixture decorator that may be autouse (a fixture a test does not name runs only
  when autouse)."""
  return "fixture" in _decorator_name(decorator) and isinstance(decorator, ast.Call) and any(
      k.arg == "autouse" and not (isinstance(k.value, ast.Constant) and not k.value.value)
      for k in decorator.keywords)


def _plain_test(node: ast.stmt | None, selves: int) -> bool:
  """A def that runs when called with `selves` arguments (hypothesis' given supplies
  the rest)."""
  if not isinstance(node, ast.FunctionDef):
    return False
  decorators = {_decorator_name(d) for d in node.decorator_list}
  if not decorators <= _HYPOTHESIS:
    return False
  args = node.args
  if "given" in decorators:
    return True
  return (len(args.posonlyargs) + len(args.args) == selves and not args.kwonlyargs
          and args.vararg is None and args.kwarg is None)


def plan(spec: RunSpec) -> list[list[str]]:
  """[node id, route] of each of spec.tests, in order."""
  return [[node, route(spec.files, node)] for node in spec.tests]


def parse(text: str, nonce: str) -> tuple[dict[str, str], bool, str]:
  """(node id -> outcome, whether the driver finished, why it refused or "") of the
  driver's output; lines without the nonce are ignored, and a test reported twice is
  "error"."""
  outcomes: dict[str, str] = {}
  seen: set[str] = set()
  done, refused = False, ""
  for line in text.splitlines():
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if not isinstance(record, dict) or record.get("n") != nonce:
      continue
    if record.get("e") == "done":
      done = True
    elif record.get("e") == "refused" and isinstance(record.get("why"), str):
      refused = record["why"][:200]
    elif record.get("e") == "test" and isinstance(record.get("id"), str):
      node = record["id"]
      outcomes[node] = "error" if node in seen else VERDICTS.get(record.get("v"), "error")
      seen.add(node)
  return outcomes, done and not refused, refused


def run(spec: RunSpec, env: testenv.TestEnv | None = None) -> TestRun:
  """Each of spec.tests in its own interpreter (module docstring): outcomes "passed" (the
  test function returned), "failed" (it raised) or "error" (no verdict); status "ok" when
  the driver reported every test. Never raises for what the tests do."""
  env = env or runner.environment(spec)
  nonce = secrets.token_hex(16)
  children = {"direct": _DIRECT, "pytest": _PYTEST}
  child_env = {"PYTHONPATH": runner.python_path(spec), "PYTHONHASHSEED": str(spec.attempt)}
  if spec.hypothesis_examples:
    child_env["RLCODE_HYPOTHESIS_EXAMPLES"] = str(spec.hypothesis_examples)
  todo = {"nonce": nonce, "seconds": spec.timeout, "env": child_env, "children": children,
          "tests": plan(spec)}
  start = time.monotonic()
  try:
    with Session(runner.session_limits(spec), mounts={testenv.MOUNT: env.path}) as session:
      session.write(_TREE, runner.tarball(spec.files))
      session.write(_PLAN, json.dumps(todo))
      result = session.exec(f"exec python3 -S -I -c {shlex.quote(_DRIVER)}",
                            timeout=spec.timeout + 30)
      try:
        text = session.read(_OUT)
      except SessionError:
        text = ""
  except SessionError as e:
    return TestRun("crash", output=f"the session died: {e}"[-2000:],
                   seconds=time.monotonic() - start)
  outcomes, done, refused = parse(text, nonce)
  status = "ok" if done and set(outcomes) == set(spec.tests) else (
      "timeout" if result.timed_out else "crash")
  return TestRun(status, outcomes, {}, 0 if status == "ok" else None,
                 time.monotonic() - start, refused or result.output[-2000:])


def cached(tests: runner.Runner, spec: RunSpec) -> TestRun:
  """`run(spec)` through `tests`' cache."""
  return tests.run(spec, run, f"crosscheck {CROSSCHECK_VERSION}")
