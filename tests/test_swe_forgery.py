"""Mining's forged passes: repositories whose code or tests forge a test's outcome.

Each forged PR (tests/swe_history.py's FORGED) adds a mul that adds and a test that
fails before it and after it, unless its outcome is forged. Each is checked twice: the
attack succeeds through an unprotected path (the positive control: pytest's report as
the single channel, or plain pytest's exit status), and validation rejects it
(rlcode.swe.validate.runners_agree on the second runner, rlcode.swe.crosscheck). The
known limits (KNOWN_LIMITS) pass both runners, as crosscheck's docstring says; they are
here so that the suite notices if that changes. One mining run shows the skip counted.
"""

import shlex

import pytest

from rlcode.sandbox.session import Session
from rlcode.swe import crosscheck, mining, routing, runner, testenv, validate
from rlcode.swe.config import SweConfig
from rlcode.swe.history import Skip
from rlcode.swe.runner import Runner, RunSpec

from swe_history import FORGED, KNOWN_LIMITS, SURVIVOR, forged_base, forged_pr, make_forged

pytestmark = pytest.mark.slow

NAMES = ("honest", *FORGED, *KNOWN_LIMITS)
# Which unprotected path each attack fools: "report" (pytest's report through the plugin,
# the single channel validation read before the second runner) and "exit" (plain pytest's
# exit status, without the plugin).
FOOLS = {"emitter": {"report"}, "report_class": {"report", "exit"}, "hook": {"report", "exit"},
         "exit_import": {"exit"}, "exit_call": {"exit"}, "plugin_module": {"report"},
         "fake_report": {"report"}, "setup_swap": {"report", "exit"},
         "hook_swap": {"report", "exit"}, "swallow": {"report", "exit"},
         "swallow_last": {"report", "exit"}}


def file_of(name):
  return next(p for p in forged_pr(name) if p.endswith(f"/test_{name}.py"))


def node(name):
  return f"{file_of(name)}::test_mul"


def plain_pytest(tree, names, env):
  """Plain pytest's exit status on each name's test file, without the report plugin: one
  sandbox, one pytest process a file."""
  path = f"{testenv.MOUNT}:/sandbox"
  script = "".join(f"PYTHONPATH={path} python3 -S -m pytest -p no:cacheprovider -q "
                   f"--rootdir=/sandbox {shlex.quote(file_of(n))} >/dev/null 2>&1; "
                   f"echo exit-status {n} $?\n" for n in names)
  spec = RunSpec(tree, (), timeout=60)
  with Session(runner.session_limits(spec), mounts={testenv.MOUNT: env.path}) as session:
    for path_, text in tree.items():
      session.write(path_, text)
    out = session.exec(script, timeout=60).output
  return {w[1]: int(w[2]) for w in (line.split() for line in out.splitlines())
          if len(w) == 3 and w[0] == "exit-status"}


@pytest.fixture(scope="module")
def forged():
  tree = forged_base()
  for name in NAMES:
    tree.update(forged_pr(name))
  tree.update(SURVIVOR)
  nodes = ("tests/test_survivor.py::test_spawn", "tests/test_survivor_victim.py::test_mul",
           *(node(n) for n in NAMES), "tests/test_honest.py::test_mul_fixture")
  main = Runner(use_cache=False).run_many(
      [RunSpec(tree, (file_of(n),), timeout=20) for n in NAMES], workers=2)
  isolated = crosscheck.run(RunSpec(tree, nodes, timeout=60))
  return dict(tree=tree, main=dict(zip(NAMES, main)), isolated=isolated,
              plain=plain_pytest(tree, [*FORGED, *KNOWN_LIMITS],
                                 runner.environment(RunSpec(tree, ()))))


def test_honest_tests_agree_in_both_routes(forged):
  honest = forged["main"]["honest"]
  both = frozenset({node("honest"), "tests/test_honest.py::test_mul_fixture"})
  assert honest.passing() == both
  assert forged["isolated"].status == "ok"
  assert [routing.route(forged["tree"], n) for n in sorted(both)] == ["direct", "pytest"]
  validate.runners_agree(both, honest, forged["isolated"])


@pytest.mark.parametrize("name", list(FORGED))
def test_forged_pass_fools_an_unprotected_path(forged, name):
  """The positive control: without the second runner, the attack works."""
  after = forged["main"][name]
  fooled = set()
  if after.status == "ok" and after.outcomes.get(node(name)) == "passed":
    fooled.add("report")
  if forged["plain"][name] == 0:
    fooled.add("exit")
  assert fooled == FOOLS[name], (after.status, after.outcomes, forged["plain"][name])


@pytest.mark.parametrize("name", list(FORGED))
def test_forged_pass_is_rejected(forged, name):
  after = forged["main"][name]
  assert forged["isolated"].outcomes[node(name)] in ("failed", "error")
  if "report" not in FOOLS[name]:
    # The report never ends with "done": judge skips the PR as a crash.
    assert after.status == "crash" and node(name) not in after.outcomes
    return
  with pytest.raises(Skip) as e:
    validate.runners_agree(frozenset({node(name)}), after, forged["isolated"])
  assert e.value.reason == "runners_disagree"


@pytest.mark.parametrize("name", list(KNOWN_LIMITS))
def test_known_limit_passes_both_runners(forged, name):
  """What crosscheck's docstring says remains possible: code that recognises the second
  runner, forges its key, or a lying __eq__ (the test cannot see it)."""
  after = forged["main"][name]
  assert after.outcomes[node(name)] == "passed"
  validate.runners_agree(frozenset({node(name)}), after, forged["isolated"])


def test_mining_counts_the_disagreement(tmp_path):
  repo, shas = make_forged(tmp_path / "repo", ("honest", "report_class"))
  result = mining.mine(SweConfig(source=str(repo.path), timeout=20.0, workers=2, gold_runs=2),
                       cache_dir=str(tmp_path / "cache"))
  assert result.report["skipped"] == {"root_commit": 1, "runners_disagree": 1}
  assert result.report["validated"] == 1
  verdict = next(v for v in result.verdicts if v.get("sha") == shas["report_class"])
  assert verdict["kept"] and "passed" in verdict["detail"] and "raised" in verdict["detail"]


@pytest.mark.parametrize("node_id,route", [
    ("tests/test_ops.py::test_add", "direct"),
    ("tests/test_ops.py::test_add[1]", "pytest"),
    ("tests/test_ops.py::C::test_m", "direct"),
    ("tests/test_ops.py::test_fix", "pytest"),
    ("tests/test_ops.py::test_given", "direct"),
    ("tests/test_ops.py::test_marked", "pytest"),
    ("tests/test_ops.py::test_imported", "pytest"),
    ("tests/test_ops.py::test_async", "pytest"),
    ("tests/test_missing.py::test_x", "pytest"),
])
def test_route_is_read_from_the_tree(node_id, route):
  text = ("import pytest\nfrom hypothesis import given, strategies as st\n"
          "from other import test_imported\n\n\ndef test_add():\n  pass\n\n\n"
          "class C:\n  def test_m(self):\n    pass\n\n\ndef test_fix(tmp_path):\n  pass\n\n\n"
          "@given(st.integers())\ndef test_given(x):\n  pass\n\n\n"
          "@pytest.mark.xfail\ndef test_marked():\n  pass\n\n\nasync def test_async():\n  pass\n")
  assert routing.route({"tests/test_ops.py": text}, node_id) == route


def test_a_conftest_or_an_autouse_fixture_routes_to_pytest():
  text = "import pytest\n\n\ndef test_add():\n  pass\n"
  files = {"tests/test_ops.py": text}
  assert routing.route(files, "tests/test_ops.py::test_add") == "direct"
  assert routing.route({**files, "conftest.py": ""}, "tests/test_ops.py::test_add") == "pytest"
  autouse = text + "\n\n@pytest.fixture(autouse=True)\ndef every():\n  pass\n"
  assert routing.route({"tests/test_ops.py": autouse}, "tests/test_ops.py::test_add") == (
      "pytest")


def test_a_process_left_behind_changes_no_later_verdict(forged):
  """The survivor forks every round and rewrites the next test's file to pass; the
  driver ends every process before the next test's tree is unpacked."""
  outcomes = forged["isolated"].outcomes
  assert outcomes["tests/test_survivor.py::test_spawn"] == "passed"
  assert outcomes["tests/test_survivor_victim.py::test_mul"] == "failed"


def test_a_given_test_with_a_fixture_routes_to_pytest():
  head = "from hypothesis import given, strategies as st\n\n\n"
  cases = {"@given(st.integers())\ndef test_a(x):\n  pass\n": "direct",
           "@given(x=st.integers())\ndef test_a(x):\n  pass\n": "direct",
           "@given(st.integers())\ndef test_a(tmp_path, x):\n  pass\n": "pytest",
           "@given(x=st.integers())\ndef test_a(tmp_path, x):\n  pass\n": "pytest",
           "@given(*[st.integers()])\ndef test_a(x):\n  pass\n": "pytest"}
  for text, want in cases.items():
    assert routing.route({"t.py": head + text}, "t.py::test_a") == want, text


def test_find_names_the_def_a_node_runs():
  text = ("import pytest\n\n\ndef test_a():\n  pass\n\n\n@pytest.mark.x\ndef test_a():\n  pass\n\n\n"
          "class Base:\n  def test_m(self):\n    pass\n\n\nclass C(Base):\n  class D:\n"
          "    def test_n(self):\n      pass\n\n\ntest_made = make()\n")
  files = {"t.py": text}
  assert routing.find(files, "t.py::test_a[1]") == ("test_a", 8)
  assert routing.find(files, "t.py::C::test_m") == ("Base.test_m", 14)
  assert routing.find(files, "t.py::C::D::test_n") == ("C.D.test_n", 20)
  assert routing.find(files, "t.py::test_made") is None


def test_the_budget_grows_with_the_tests_and_a_timeout_is_not_a_disagreement(tmp_path):
  spec = RunSpec({}, tuple(f"t.py::test_{i}" for i in range(300)), timeout=20)
  assert crosscheck.seconds(spec) == 20 + 300 * crosscheck.PER_TEST_SECONDS
  slow = runner.TestRun("timeout", {"t.py::test_0": "passed"}, seconds=620.0)
  with pytest.raises(Skip) as e:
    validate.runners_agree(frozenset({"t.py::test_0"}), runner.TestRun("ok", {}), slow)
  assert e.value.reason == "timeout"
  outcomes, status, why = crosscheck.parse('{"n": "k", "v": "rt", "why": ""}\n', "k",
                                           ("a", "b", "c"))
  assert (outcomes, status) == ({"a": "passed", "b": "error"}, "timeout")
  tests = Runner(cache_dir=str(tmp_path))
  calls = []

  def timing_out(spec_, env):
    calls.append(1)
    return slow

  one = RunSpec({"t.py": ""}, ("t.py::test_0",), timeout=1)
  for _ in range(2):
    tests.run(one, timing_out, "crosscheck x", cache_timeouts=False)
  assert len(calls) == 2
