"""Executable PR tasks end to end on a history made at test time (tests/swe_history.py):
mining with every skip reason, validation, the cache, the command, the SWE-bench round
trip, the rewards, the agent's workspace with the gold agent, and decomposition."""

import dataclasses
import json

import ml_collections
import pytest

from rlcode import cli, rewards
from rlcode.agent import env as env_lib
from rlcode.agent import tools as tools_lib
from rlcode.agent.chat import CALL_CLOSE, CALL_OPEN
from rlcode.data import sources
from rlcode.data.tasks import load_tasks
from rlcode.swe import decompose, export, mining, patches, tasks, workspace
from rlcode.swe.builder import SweTasks
from rlcode.swe.config import SweConfig
from rlcode.swe.runner import Runner

from swe_history import make_history, make_untested

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
  """Caches that default to ~/.cache (the reward's runner, tfds) stay in the test's folder."""
  monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def history(tmp_path_factory):
  root = tmp_path_factory.mktemp("swe")
  escaped = root / "escaped.txt"
  repo, shas = make_history(root / "repo", escape_target=escaped)
  config = SweConfig(source=str(repo.path), timeout=12.0, workers=2, gold_runs=3)
  result = mining.mine(config, cache_dir=str(root / "cache"))
  return dict(root=root, repo=repo, shas=shas, config=config, result=result,
              escaped=escaped, by_id={t.id: t for t in result.tasks})


def task_of(history, name):
  (task,) = [t for t in history["result"].tasks if t.extra.commit == history["shas"][name]]
  return task


def test_counts_every_pr_once_with_its_reason(history):
  report = history["result"].report
  assert report["walked"] == 14 and report["with_tests"] == 9
  assert report["skipped"] == {"root_commit": 1, "no_test_change": 3, "no_code_change": 1,
                               "timeout": 1,
                               "crash": 1, "missing_dependency": 1, "no_passing_test": 1,
                               "flaky": 1}
  assert report["runnable"] == report["kept"] == 5 and report["validated"] == 4
  assert report["validated"] + sum(report["skipped"].values()) == report["walked"]
  assert report["skip_details"]["missing_dependency"] == ["nonexistent_rlcode_dependency"]
  # The test that fails under odd hash seeds passed the after run (seed 0) and fails the
  # gold patch's second run (seed 1).
  assert report["skip_details"]["flaky"] == [
      "gold fails tests/test_half.py::test_half (1 tests) in run 2 of 3"]
  assert report["tasks"] == {"train": 3, "test": 1} and report["gold_runs"] == 3
  verdicts = {v.get("sha"): v["reason"] for v in history["result"].verdicts}
  shas = history["shas"]
  assert [verdicts[shas[k]] for k in ("hang", "kill", "escape", "missing", "flaky")] == [
      "timeout", "crash", "no_passing_test", "missing_dependency", "flaky"]
  assert all(t.extra.gold_runs == 3 for t in history["result"].tasks)


def test_the_base_declares_dependencies_the_before_run_needs(history):
  # The PR drops six from setup.py; its base requires it, and test_text passes there with
  # it: PASS_TO_PASS, not FAIL_TO_PASS (without the base's declaration both tests failed
  # to import before the PR and both were FAIL_TO_PASS).
  drop = task_of(history, "drop")
  assert drop.extra.fail_to_pass == ("tests/test_compat.py::CompatTests::test_join",)
  assert drop.extra.pass_to_pass == ("tests/test_compat.py::CompatTests::test_text",)
  assert "six" in drop.extra.test_deps


def test_the_escaping_test_wrote_nothing_outside(history):
  assert not history["escaped"].exists()


def test_fail_to_pass_and_pass_to_pass(history):
  mul, two, sub = (task_of(history, k) for k in ("mul", "two", "sub"))
  assert mul.extra.fail_to_pass == ("tests/test_ops.py::test_mul",)
  assert mul.extra.pass_to_pass == ("tests/test_ops.py::test_add",)
  assert two.extra.fail_to_pass == ("tests/test_fmt.py::test_show", "tests/test_ops.py::test_neg")
  assert two.extra.pass_to_pass == ("tests/test_ops.py::test_add", "tests/test_ops.py::test_mul")
  assert two.extra.test_files == ("tests/test_fmt.py", "tests/test_ops.py")
  assert sub.extra.python_path == ("src", ".") and mul.extra.python_path == (".",)
  # SWE-bench's ids: owner__name-N, N the PR's position on the first-parent chain.
  assert mul.id == "local__repo-2" and two.id == "local__repo-3"
  assert mul.extra.repo_name == "local/repo"
  assert tasks.request_of(two) == "Fix neg and show\n\nFix neg\n\nFix show"
  assert two.extra.base_commit == history["repo"].git("rev-parse", f"{history['shas']['two']}^1")
  # The test patch is withheld from the workspace: the base has no test_fmt.py.
  assert "tests/test_fmt.py" not in tasks.base_files(two)
  assert "tests/test_fmt.py" in tasks.evaluation_tree(tasks.base_files(two),
                                                      two.extra.test_patch, {})


def test_every_task_validates_through_the_reward(history):
  """Gold resolves; the empty change fails every FAIL_TO_PASS test (run here again,
  outside the miner, through the reward's own path)."""
  found = history["result"].tasks
  gold = [workspace.gold_answer(t) for t in found]
  out = rewards.compute({"swe_tests": 1.0}, found, gold)
  assert out.scores.tolist() == [1.0] * len(found)
  runner = Runner(use_cache=False)
  for t in found:
    empty = runner.run(tasks.run_spec(t, tasks.evaluation_tree(
        tasks.base_files(t), t.extra.test_patch, {})))
    assert not set(t.extra.fail_to_pass) & empty.passing()


class _FlakyRunner(Runner):
  """Runs for real, then (when `flip` is set) turns the named tests of second attempts
  on trees holding `marker` into failures or passes: a flaky test, on demand. Records
  the pytest runs' specs (not the second runner's)."""

  def __init__(self, cache_dir, flip, marker):
    super().__init__(cache_dir)
    self.flip, self.marker, self.specs = flip, marker, []

  def run(self, spec, *how, **options):
    result = super().run(spec, *how, **options)
    if how:  # the second runner's cross-check, not a pytest run
      return result
    self.specs.append(spec)
    if spec.attempt != 1 or not any(self.marker in t for t in spec.files.values()):
      return result
    outcomes = dict(result.outcomes)
    outcomes.update({t: o for t, o in self.flip.items() if t in outcomes})
    return dataclasses.replace(result, outcomes=outcomes)


@pytest.mark.parametrize("flip,marker,reason", [
    ({}, "", None),
    ({"tests/test_ops.py::test_mul": "failed"}, "return a * b", "flaky"),  # gold, 2nd run
    ({"tests/test_ops.py::test_mul": "passed"}, "test_mul", "flaky"),  # empty, 2nd run
])
def test_validation_runs_the_fail_to_pass_tests_again_and_drops_a_flaky_one(
    history, tmp_path, flip, marker, reason):
  from rlcode.data.git.repo import Git
  from rlcode.swe import history as history_lib
  runner = _FlakyRunner(str(tmp_path / "runs"), flip, marker)
  git = Git(str(history["repo"].path))
  sha = history["shas"]["mul"]
  with git.blobs() as blobs:
    candidate = next(c for c in history_lib.candidates(git, git.first_parent_log(sha, 1))
                     if isinstance(c, history_lib.Candidate))
    config = dataclasses.replace(history["config"], repo_name="local/repo")
    verdict = mining._Evaluator(config, history_lib.Reader(git, blobs), runner,
                                {sha: 2})(candidate)
  assert verdict["reason"] == reason and verdict["validated"] is (reason is None)
  # before and after on the whole test file; then on test_mul alone the empty patch once
  # and the gold patch until it fails or has run 3 times in all.
  runs = [(("tests/test_ops.py",), 0), (("tests/test_ops.py",), 0),
          (("tests/test_ops.py::test_mul",), 1), (("tests/test_ops.py::test_mul",), 1),
          (("tests/test_ops.py::test_mul",), 2)]
  assert [(s.tests, s.attempt) for s in runner.specs] == runs[:{None: 5, "return a * b": 4,
                                                              "test_mul": 3}[marker or None]]


def test_a_cached_rerun_runs_nothing(history):
  again = mining.mine(history["config"], cache_dir=str(history["root"] / "cache"))
  assert again.report["runs"] == 0
  assert [t.id for t in again.tasks] == [t.id for t in history["result"].tasks]
  assert again.tasks == history["result"].tasks


def test_rewards_weigh_tests_and_diff(history):
  mul = task_of(history, "mul")
  gold = workspace.gold_answer(mul)
  wrong = gold.replace("return a * b", "return a + b")
  cheat = ("<think>\nx\n</think>\n<solution>\n```diff\n--- a/tests/test_ops.py\n"
           "+++ b/tests/test_ops.py\n@@ -1,1 +1,1 @@\n-import calc\n+import calc, os\n"
           "```\n</solution>")
  out = rewards.compute({"swe_tests": 1.0, "diff": 0.5}, [mul] * 4,
                        [gold, wrong, cheat, "no answer"])
  assert out.scores[0] == pytest.approx(1.5)  # resolved, and the gold's own diff
  assert 0 < out.scores[1] < 0.5  # not resolved; close to the gold diff
  # An answer that edits only the tests changes nothing the tests run on.
  assert out.details[2]["swe_tests"]["resolved"] is False
  assert out.details[3]["swe_tests"]["error"] == "tag_count"
  assert out.scores[3] == pytest.approx(-0.5)
  frac = rewards.compute({"swe_tests": 1.0}, [mul], [wrong],
                         {"swe_tests": {"mode": "fail_to_pass"}})
  assert frac.scores.tolist() == [0.0] and frac.metrics["swe_tests/applied"] == 1.0


def _call(name, arguments):
  return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CALL_CLOSE}"


def test_the_gold_agent_resolves_every_task_through_the_editor(history):
  scorer = env_lib.Scorer({"swe_tests": 1.0})
  env = env_lib.ToolEnv(tools_lib.make_tools(["bash", "editor", "run_tests", "lint", "finish"]),
                        scorer, max_turns=40)
  try:
    for task in history["result"].tasks:
      assert "--- BEGIN REQUEST ---" in env.reset(task)
      step = env.step(_call("run_tests", {}), "call")
      # The visible tests, at the base (drop's test module is new: there are none).
      visible = any(p in tasks.base_files(task) for p in task.extra.test_files)
      assert step.observation.startswith(
          "passed " if visible else "failed: 0/0 passed; the task has no visible test file")
      calls = workspace.gold_calls(task)
      assert all(name in ("editor", "finish") for name, _ in calls)
      for name, arguments in calls:
        step = env.step(_call(name, arguments), "call")
      assert step.done and step.info["status"] == "finished"
      assert step.reward == 1.0, (task.id, step.info)
  finally:
    env.close()


def test_lint_and_pytest_in_the_episode(history):
  env = env_lib.ToolEnv(tools_lib.make_tools(["bash", "editor", "lint", "finish"]),
                        env_lib.Scorer({"swe_tests": 1.0}), max_turns=10, bash_seconds=30)
  try:
    env.reset(task_of(history, "mul"))
    env.step(_call("editor", {"command": "create", "path": "calc/extra.py",
                              "file_text": "import os\n\ndef f():\n  return undefined\n"}), "call")
    step = env.step(_call("lint", {}), "call")
    assert "calc/extra.py:1:8: F401" in step.observation and "F821" in step.observation
    step = env.step(_call("bash", {"command": "python3 -m pytest -q -p no:cacheprovider "
                                              "tests/test_ops.py"}), "call")
    assert "1 passed" in step.observation, step.observation
    step = env.step(_call("finish", {}), "call")
    assert step.reward == 0.0 and not step.info["reward_details"]["swe_tests"]["resolved"]
  finally:
    env.close()


def test_the_command_prints_the_counts_and_writes_both_formats(history, capsys):
  out = history["root"] / "out"
  argv = ["mine", str(history["repo"].path), "--tasks", "swe", "--out", str(out),
          "--timeout", "12", "--workers", "2", "--gold-runs", "3",
          "--cache-dir", str(history["root"] / "cache")]
  assert cli.main(argv) == 0
  table = capsys.readouterr().out
  assert "walked (first-parent commits)         14" in table
  assert "  missing_dependency                  1" in table
  assert "gold runs each passed / repo          3 / local/repo" in table
  assert table.rstrip().endswith("swe tasks: 4")
  read = export.read(str(out / export.FILE_NAME))
  assert read == history["result"].tasks  # the round trip: same tasks
  builder = SweTasks(data_dir=str(out), swe=history["config"])
  stored = load_tasks(builder, "train") + load_tasks(builder, "test")
  assert sorted(stored, key=lambda t: t.id) == history["result"].tasks
  # The JSON lines as a config's task source, split as the miner splits.
  data = ml_collections.ConfigDict(dict(source="swebench", path=str(out / export.FILE_NAME),
                                        repo=None, data_dir=str(history["root"] / "tfds")))
  assert sources.load(data, "train") == [t for t in history["result"].tasks
                                         if t in history["result"].splits["train"]]
  assert sources.load(data, "test") == history["result"].splits["test"]


def test_a_repository_without_tests_gives_no_task(tmp_path, capsys):
  repo = make_untested(tmp_path / "repo")
  assert cli.main(["mine", str(repo.path), "--tasks", "swe", "--out", str(tmp_path / "out"),
                   "--cache-dir", str(tmp_path / "cache")]) == 0
  table = capsys.readouterr().out
  assert "no_test_change" in table and table.rstrip().endswith("swe tasks: 0")
  assert (tmp_path / "out" / export.FILE_NAME).read_text() == ""


def test_the_swebench_package_reads_the_file_and_grades_as_we_do(history):
  from swebench.harness.constants import ResolvedStatus
  from swebench.harness.grading import get_eval_tests_report, get_resolution_status
  from swebench.harness.utils import load_swebench_dataset
  from swebench.types import SWEbenchInstance
  path = history["root"] / "export.jsonl"
  export.write(str(path), history["result"].tasks)
  loaded = load_swebench_dataset(str(path), instance_ids=[t.id for t in
                                                          history["result"].tasks])
  assert len(loaded) == 4
  runner = Runner(use_cache=False)
  for row, task in zip(sorted(loaded, key=lambda r: r["instance_id"]), history["result"].tasks):
    assert set(SWEbenchInstance.__annotations__) <= set(row)
    assert row["FAIL_TO_PASS"] == list(task.extra.fail_to_pass)
    gold_runs = {"FAIL_TO_PASS": row["FAIL_TO_PASS"], "PASS_TO_PASS": row["PASS_TO_PASS"]}
    base = tasks.base_files(task)
    for changes, want in [(tasks.gold_changes(task, base), ResolvedStatus.FULL.value),
                          ({}, ResolvedStatus.NO.value)]:
      run = runner.run(tasks.run_spec(task, tasks.evaluation_tree(base, row["test_patch"],
                                                                   changes)))
      status_map = {t: {"passed": "PASSED", "xfailed": "XFAIL", "skipped": "SKIPPED",
                        "error": "ERROR"}.get(o, "FAILED") for t, o in run.outcomes.items()}
      report = get_eval_tests_report(status_map, gold_runs)
      assert get_resolution_status(report) == want


def _harness_log(history, task, patch, where, pytest_args=None) -> tuple[str, int]:
  """What SWE-bench's harness logs for `patch`, and the exit status: the repository at
  the base commit in `where` (for /testbed), the patch applied with git apply, then the
  instance's eval script as the harness assembles it (make_test_spec), run with this
  interpreter's python3 and a TMPDIR of its own, which it must leave empty; with
  `pytest_args`, pytest's own output with them instead of the script."""
  import os
  import subprocess
  import sys

  from swebench.harness.utils import make_test_spec
  repo = history["repo"]
  subprocess.run(["git", "clone", "-q", str(repo.path), str(where)], check=True)
  subprocess.run(["git", "-C", str(where), "checkout", "-q", task.extra.base_commit], check=True)
  if patch:
    subprocess.run(["git", "-C", str(where), "apply", "-"], input=patch.encode(), check=True)
  env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
  if pytest_args is not None:
    subprocess.run(["git", "-C", str(where), "apply", "-"], input=task.extra.test_patch.encode(),
                   check=True)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           *pytest_args, *task.extra.test_files], cwd=where, env=env,
                          capture_output=True, text=True, timeout=60, check=False).stdout, 0
  row = export.to_row(task)
  row["eval_script"] = export.eval_script(task, workdir=str(where))
  scratch = where.parent / f"{where.name}.tmp"
  scratch.mkdir()
  out = subprocess.run(["bash", "-c", make_test_spec(row).eval_script], cwd=where,
                       env=dict(env, TMPDIR=str(scratch)), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60, check=False)
  assert not list(scratch.iterdir()), "the eval script left its temporary folder"
  return out.stdout, out.returncode


def test_swebench_harness_accepts_the_export_and_grades_as_we_do(history, tmp_path):
  """Each exported instance through swebench 5's own make_test_spec, its eval script run
  on a checkout as the harness runs it, the log graded by get_eval_report; rlcode's
  verdict (its own run of the same tree) agrees for the gold patch, the empty patch and a
  patch that fails one subTest of a unittest test."""
  from swebench.harness.grading import get_eval_report, get_logs_eval, parse_test_exit_code
  from swebench.harness.log_parsers import PARSER_REGISTRY
  from swebench.harness.utils import load_swebench_dataset, make_test_spec
  path = tmp_path / "export.jsonl"
  export.write(str(path), history["result"].tasks)
  rows = {r["instance_id"]: r for r in load_swebench_dataset(str(path))}
  runner = Runner(str(history["root"] / "cache" / "runs"))
  drop = task_of(history, "drop")
  base = tasks.base_files(drop)
  # join([]) is "-": the subTest of [] fails, the one of [1, 2] passes.
  half = patches.render(base, {"calc/compat.py": "def text(x):\n  return str(x)\n\n\n"
                               "def join(xs):\n  return ','.join(map(str, xs)) or '-'\n"})
  cases = [(t, name, p) for t in history["result"].tasks
           for name, p in (("gold", t.extra.patch), ("empty", ""))] + [(drop, "subtest", half)]
  for i, (task, name, patch) in enumerate(cases):
    row = rows[task.id]
    spec = make_test_spec(row)
    assert spec.image == f"swebench/sweb.eval.x86_64.{task.id}:latest".replace("__", "_1776_")
    assert (row["repo"], row["log_parser"], row["eval_type"]) == (
        "local/repo", "parse_log_pytest_v2", "pass_and_fail")
    changes = patches.apply(tasks.base_files(task), patch) if patch else {}
    run = runner.run(tasks.run_spec(task, tasks.evaluation_tree(
        tasks.base_files(task), task.extra.test_patch, changes)))
    ours = set(task.extra.fail_to_pass + task.extra.pass_to_pass) <= run.passing()
    log = tmp_path / f"log{i}.txt"
    text, exit_status = _harness_log(history, task, patch, tmp_path / f"testbed{i}")
    log.write_text(text)
    # pytest's status, after the reset that ends the script: 0 only where every test passed.
    assert exit_status == parse_test_exit_code(text) and (exit_status == 0) is ours, (
        task.id, name, exit_status)
    theirs = get_eval_report(spec, {"instance_id": task.id, "model_patch": patch,
                                    "model_name_or_path": name}, str(log), True)[task.id]
    assert theirs["patch_successfully_applied"], log.read_text()[-2000:]
    assert theirs["resolved"] is ours is (name == "gold"), (task.id, name)
  # The known difference: pytest's own report says PASSED for the test whose subTest
  # failed, and SWE-bench's pytest parsers read that as passed; the export's log does not.
  status, _ = get_logs_eval(spec, str(log))
  assert status["tests/test_compat.py::CompatTests::test_join"] == "FAILED"
  own, _ = _harness_log(history, drop, half, tmp_path / "own", ["-rA"])
  join = "tests/test_compat.py::CompatTests::test_join"
  assert "SUBFAILED" in own and f"PASSED {join}" in own
  for parser in ("parse_log_pytest", "parse_log_pytest_v2"):
    assert PARSER_REGISTRY[parser](own, spec)[join] == "PASSED"


def test_decomposition_finds_the_part_no_test_sees(history):
  two = task_of(history, "two")
  runner = Runner(str(history["root"] / "cache" / "runs"))
  files = decompose.check(history["result"].tasks, "file", runner, workers=2)
  hunks = decompose.check(history["result"].tasks, "hunk", runner, workers=2)
  by_part = {c.part: c.makes_pass for c in files + hunks}
  assert by_part[f"{two.id}:calc/fmt.py"] == ("tests/test_fmt.py::test_show",)
  assert by_part[f"{two.id}:calc/ops.py"] == ("tests/test_ops.py::test_neg",)
  assert by_part[f"{two.id}:calc/fmt.py#1"] == ()  # the docstring: no test sees it
  assert by_part[f"{two.id}:calc/fmt.py#2"] == ("tests/test_fmt.py::test_show",)
  summary = decompose.summary(hunks)
  drop = task_of(history, "drop")
  # setup.py's dropped requirement is a part no test sees; compat.py's one hunk is seen.
  assert by_part[f"{drop.id}:setup.py"] == by_part[f"{drop.id}:setup.py#1"] == ()
  assert by_part[f"{drop.id}:calc/compat.py#1"] == (
      "tests/test_compat.py::CompatTests::test_join",)
  assert summary["tasks"] == 4 and summary["parts"] == 8 and summary["checked"] == 6
  assert summary["parts_per_pr"] == {"1": 1, "2": 2, "3-4": 1, "5-8": 0, "9+": 0}
  assert decompose.summary(files)["parts"] == 7 and decompose.summary(files)["checked"] == 6


def test_a_run_reads_hypothesis_tables_equal_to_those_it_would_compute(tmp_path):
  # The test environment carries hypothesis's Unicode tables and each run's workspace
  # gets a copy (rlcode.swe.testenv.HYPOTHESIS_DATA): the run reads them instead of
  # encoding every code point, and they are what hypothesis computes itself.
  from rlcode.swe.runner import RunSpec
  test = '''\
import os, unicodedata
from hypothesis import given, strategies as st
from hypothesis.internal import charmap

TABLES = os.path.join(".hypothesis", "unicode_data", unicodedata.unidata_version)


def test_the_tables_are_there_before_hypothesis_reads_them():
  assert {"charmap.json.gz", "codec-v2-utf-8.json.gz"} <= set(os.listdir(TABLES))


def test_the_tables_equal_what_hypothesis_computes():
  seeded_codec = charmap.intervals_from_codec("utf-8")
  seeded_map = charmap.charmap()
  for name in ("codec-v2-utf-8.json.gz", "charmap.json.gz"):
    os.remove(os.path.join(TABLES, name))
  charmap.intervals_from_codec.cache_clear()
  charmap._charmap = None
  fresh_codec = charmap.intervals_from_codec("utf-8")
  assert [s.intervals for s in seeded_codec] == [s.intervals for s in fresh_codec]
  assert charmap.charmap() == seeded_map


@given(st.text(max_size=3))
def test_text_draws(s):
  assert isinstance(s, str)
'''
  spec = RunSpec({"tests/test_tables.py": test}, ("tests/test_tables.py",), deps=("hypothesis",),
                 timeout=60.0)
  run = Runner(str(tmp_path / "runs")).run(spec)
  assert run.status == "ok", run.output
  assert run.outcomes == {
      "tests/test_tables.py::test_the_tables_are_there_before_hypothesis_reads_them": "passed",
      "tests/test_tables.py::test_the_tables_equal_what_hypothesis_computes": "passed",
      "tests/test_tables.py::test_text_draws": "passed"}, run.output
