"""Executable PR tasks, the parts that run no repository's tests: patches, declared
dependencies, the test environment (one sandbox reads it), the report parser, the
judgement of runs, extras, the schema and the command's bad input."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcode import cli
from rlcode.config import loader
from rlcode.data import edits
from rlcode.data.tasks import Task
from rlcode.swe import deps, export, patches, validate
from rlcode.swe.history import Skip
from rlcode.swe.runner import TestRun, parse_report

AGENT_SWE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "configs", "agent_swe.py")
BEFORE = {"pkg/a.py": "def f():\n  return 1\n", "pkg/gone.py": "X = 1\n",
          "tests/test_a.py": "from pkg.a import f\n"}
AFTER = {"pkg/a.py": "def f():\n  return 2\n", "pkg/gone.py": None, "pkg/new.py": "Y = 2\n",
         "pkg/empty.py": ""}


def test_render_then_apply_gives_the_after_tree():
  text = patches.render(BEFORE, AFTER)
  assert text.startswith("diff --git a/pkg/a.py b/pkg/a.py\n")
  assert "deleted file mode 100644" in text and "new file mode 100644" in text
  assert patches.apply(BEFORE, text) == AFTER
  assert patches.applied(BEFORE, text) == {"pkg/a.py": "def f():\n  return 2\n",
                                           "pkg/new.py": "Y = 2\n", "pkg/empty.py": "",
                                           "tests/test_a.py": "from pkg.a import f\n"}
  assert patches.paths(text) == ["pkg/a.py", "pkg/empty.py", "pkg/gone.py", "pkg/new.py"]
  assert patches.apply(BEFORE, "") == {}


def test_git_applies_the_rendered_patch(tmp_path):
  """An independent truth: git's own apply takes the patch to the same tree."""
  for path, text in BEFORE.items():
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(text)
  (tmp_path / "p.diff").write_text(patches.render(BEFORE, AFTER))
  subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, capture_output=True)
  for path, text in AFTER.items():
    assert (tmp_path / path).exists() == (text is not None)
    if text is not None:
      assert (tmp_path / path).read_text() == text


FILLER = "".join(f"x{i} = {i}\n" for i in range(20))
# A change that, re-diffed hunk by hunk, ends a hunk with added lines and no context
# after them, which git and GNU patch read as a hunk that must end the file.
RETURN_TWICE = (
    FILLER + "\n  return self\n\ndef add_cmp(self):\n  cd = {}\n\n  cd['a'], cd['b'] = (\n"
    "    f(m)\n    for m in g()\n  )\n\n  return self\n" + FILLER,
    FILLER + "\n  return self\n\ndef add_eq(self):\n  cd = {}\n\n  cd['a'] = (\n    f(m)\n"
    "    for m in h()\n  )\n\n  return self\n\ndef add_order(self):\n  cd = {}\n\n"
    "  cd['b'] = (\n    f(m)\n    for m in k()\n  )\n\n  return self\n" + FILLER)


def test_git_applies_a_hunk_whose_lines_could_align_otherwise(tmp_path):
  old, new = RETURN_TWICE
  (tmp_path / "m.py").write_text(old)
  (tmp_path / "p.diff").write_text(patches.render({"m.py": old}, {"m.py": new}))
  subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, capture_output=True)
  assert (tmp_path / "m.py").read_text() == new


def test_a_patch_that_does_not_fit_raises():
  text = patches.render(BEFORE, AFTER)
  with pytest.raises(edits.FormatError):
    patches.apply({**BEFORE, "pkg/a.py": "def g():\n  pass\n"}, text)
  with pytest.raises(edits.FormatError):  # a deletion of text the file does not hold
    patches.apply({**BEFORE, "pkg/gone.py": "X = 2\n"}, text)


@pytest.mark.parametrize("path, test", [
    ("tests/test_a.py", True), ("src/pkg/tests/helpers.py", True), ("conftest.py", True),
    ("pkg/test_x.py", True), ("pkg/x_test.py", True), ("testing/data.json", True),
    ("pkg/a.py", False), ("pkg/contest.py", False), ("docs/tests.rst", False)])
def test_test_paths(path, test):
  assert patches.is_test_path(path) == test
  assert patches.is_code_path(path) == (not test and path.endswith(".py"))


def test_declared_dependencies():
  files = {
      "pyproject.toml": '[project.optional-dependencies]\ntests = ["hypothesis>=6", "pytest"]\n'
                        'docs = ["sphinx"]\n[dependency-groups]\ndev = [{include-group = '
                        '"lint"}, "Cloud_Pickle; python_version > \'3\'"]\nlint = ["ruff"]\n',
      "setup.cfg": "[options.extras_require]\ntesting =\n  zope.interface\n",
      "setup.py": 'EXTRAS = {"tests-no-zope": [\n  # it doesn\'t break [really]\n  "six",\n'
                  '  \'pympler>=1; python_implementation == "CPython"\'],\n  "docs": ["furo"]}\n'
                  'EXTRAS["tests"] = EXTRAS["tests-no-zope"] + ["attrs"]\n'
                  'setup(install_requires=["six-runtime"], tests_require=["nose2"])\n',
      "requirements/test.txt": "-r base.txt\nmock==1.0  # pinned\n",
      "requirements.txt": "attrs-runtime>=1\n",
      "requirements/base.txt": "coverage\n",
      "tox.ini": "[testenv]\ndeps =\n  py3: nose\n  -rdev.txt\n",
      "docs/requirements.txt": "furo\n"}
  assert deps.declared_deps(files) == (
      "attrs", "attrs-runtime", "cloud-pickle", "coverage", "hypothesis", "mock", "nose",
      "nose2", "pympler", "pytest", "ruff", "six", "six-runtime", "zope-interface")
  assert deps.declared_deps({"pyproject.toml": "not [toml"}) == ()
  assert deps.declared_deps({"pyproject.toml": '[project]\ndependencies = ["packaging"]\n',
                             "setup.cfg": "[options]\ninstall_requires =\n  idna\n"}) == (
      "idna", "packaging")


def test_import_path_and_top_level_names():
  src = {"src/pkg/__init__.py": "", "src/pkg/a.py": "", "setup.py": "", "tests/t.py": ""}
  assert deps.python_path(src) == ("src", ".")
  assert deps.python_path({"pkg/__init__.py": ""}) == (".",)
  assert deps.top_level_names(src) == {"pkg", "setup"}


def test_the_report_parser_trusts_nothing_without_the_nonce():
  lines = [
      '{"n": "K", "e": "test", "id": "t.py::a", "o": "passed"}',
      '{"n": "forged", "e": "test", "id": "t.py::b", "o": "passed"}',
      '{"n": "K", "e": "test", "id": "t.py::c", "o": "excellent"}',
      'not json', '[1, 2]', '{"n": "K", "e": "test", "id": 5, "o": "passed"}',
      '{"n": "K", "e": "test", "id": "' + "x" * 5000 + '", "o": "passed"}',
      '{"n": "K", "e": "test", "id": "t.py::d", "o": "failed"}',
      '{"n": "K", "e": "test", "id": "t.py::d", "o": "passed"}',
      '{"n": "K", "e": "collect_error", "id": "u.py", "msg": "boom"}',
      '{"n": "K", "e": "done", "status": 1}']
  outcomes, errors, status = parse_report("\n".join(lines), "K")
  assert outcomes == {"t.py::a": "passed", "t.py::d": "failed"}
  assert errors == {"u.py": "boom"} and status == 1
  assert parse_report("\n".join(lines[:-1]), "K")[2] is None


def run(outcomes=None, status="ok", exit_status=1, errors=None):
  return TestRun(status, outcomes or {}, errors or {}, exit_status)


def test_judge_finds_fail_to_pass_and_pass_to_pass():
  before = run({"t::a": "passed", "t::b": "failed", "t::c": "skipped", "t::d": "passed"})
  after = run({"t::a": "passed", "t::b": "passed", "t::c": "xfailed", "t::d": "failed",
               "t::e": "passed"}, exit_status=1)
  f2p, p2p = validate.judge(before, after, frozenset())
  assert f2p == {"t::b", "t::c", "t::e"} and p2p == {"t::a"}


@pytest.mark.parametrize("before, after, reason", [
    (run(status="timeout"), run({"t::a": "passed"}), "timeout"),
    (run(), run(status="crash"), "crash"),
    (run(), run({"t::a": "passed"}, exit_status=4), "pytest_error"),
    (run(), run(errors={"t.py": "E   ModuleNotFoundError: No module named 'zope.x'"}),
     "missing_dependency"),
    (run(), run(errors={"t.py": "E   ModuleNotFoundError: No module named 'imp'"}),
     "python_version"),
    (run(), run(errors={"t.py": "E     print 'x'\nE   SyntaxError: invalid syntax"}),
     "python_version"),
    (run(), run(errors={"t.py": "E   ImportError: cannot import name 'Mapping' from "
                                "'collections'"}), "python_version"),
    (run(), run(errors={"t.py": "E   NameError: name 'x' is not defined"}),
     "collection_error"),
    (run(), run({"t::a": "failed"}), "no_passing_test"),
    (run({"t::a": "passed"}), run({"t::a": "passed"}), "no_fail_to_pass"),
])
def test_judge_skips_with_the_first_reason(before, after, reason):
  with pytest.raises(Skip) as e:
    validate.judge(before, after, frozenset())
  assert e.value.reason == reason


def test_a_module_of_the_tree_is_not_a_missing_dependency():
  after = run(errors={"t.py": "E   ModuleNotFoundError: No module named 'pkg.gone'"})
  with pytest.raises(Skip) as e:
    validate.judge(run(), after, frozenset({"pkg"}))
  assert e.value.reason == "collection_error"


def test_validation_drops_what_changes_between_runs():
  f2p = frozenset({"t::b"})
  # The repeated gold runs are of the FAIL_TO_PASS tests alone.
  validate.gold_passes(f2p, run({"t::b": "passed"}), 2, 8)
  validate.empty_fails(f2p, run({"t::b": "failed"}))
  validate.empty_fails(f2p, run())
  for gold in (run({"t::b": "failed"}), run()):
    with pytest.raises(Skip) as e:
      validate.gold_passes(f2p, gold, 5, 8)
    assert (e.value.reason, e.value.detail) == ("flaky", "gold fails t::b (1 tests) in run 5 of 8")
  with pytest.raises(Skip) as e:
    validate.empty_fails(f2p, run({"t::b": "passed"}))
  assert e.value.reason == "flaky"
  assert validate.functions(["f.py::C::t[a::b]", "f.py::C::t[2]", "f.py::u"]) == (
      "f.py::C::t", "f.py::u")


@pytest.mark.parametrize("status", ["timeout", "crash"])
def test_a_rerun_that_did_not_end_is_its_status_not_a_flake(status):
  """A gold or empty rerun cut by the clock (a busy machine) or killed says nothing of the
  tests: it is skipped as what happened to it, and a timeout is not cached (mining)."""
  f2p = frozenset({"t::b"})
  for check in (validate.gold_passes, validate.empty_fails):
    with pytest.raises(Skip) as e:
      check(f2p, TestRun(status, {}, {}, None, 1.0, "cut"), *((3, 8) if check is
                                                               validate.gold_passes else ()))
    assert e.value.reason == status


def test_swe_extra_round_trips_through_a_stored_task():
  task = Task(id="r-1", prompt="p", kind="swe", extra={
      "repo": "r.bundle", "base_commit": "a" * 40, "fail_to_pass": ["t::a"],
      "pass_to_pass": [], "test_files": ["t.py"], "python_path": ["src", "."]})
  back = Task.from_example(task.to_example())
  assert back == task and back.extra.fail_to_pass == ("t::a",)
  assert back.extra.python_path == ("src", ".")


def test_the_schema_knows_the_swe_sources(tmp_path):
  import ml_collections
  def resolve(data):
    config = loader.read_config_file(AGENT_SWE)
    config.data = ml_collections.ConfigDict(data)
    return loader.resolve(config)
  with pytest.raises(ValueError, match="data.repo must be set"):
    resolve(dict(source="swe"))
  with pytest.raises(ValueError, match="data.swe is for source 'swe'"):
    resolve(dict(source="jsonl", path="x.jsonl", swe=dict(timeout=5.0)))
  with pytest.raises(ValueError, match="data.swe.timeout"):
    resolve(dict(source="swe", repo="r", swe=dict(timeout="soon")))
  resolved = resolve(dict(source="swe", repo="r", swe=dict(timeout=5.0)))
  assert resolved.data.swe.timeout == 5.0 and resolved.data.swe.hypothesis_examples == 20


@pytest.mark.parametrize("argv, needle", [
    (["--tasks", "swe", "--granularity", "hunk"], "--granularity is for --tasks diffs"),
    (["--timeout", "5"], "--timeout is for --tasks swe"),
    (["--tasks", "swe", "--timeout", "-1"], "SweConfig.timeout=-1.0 must be > 0"),
    (["--tasks", "swe", "--hypothesis-examples", "-2"], "hypothesis_examples=-2 < 0"),
    (["--tasks", "swe", "--gold-runs", "1"], "SweConfig.gold_runs=1 < 2"),
    (["--tasks", "swe", "--repo-name", "more-itertools"],
     "SweConfig.repo_name='more-itertools' is not owner/name"),
    (["--gold-runs", "3"], "--gold-runs is for --tasks swe"),
    (["--repo-name", "a/b"], "--repo-name is for --tasks swe"),
    (["--tasks", "sweet"], "invalid choice: 'sweet'"),
])
def test_mine_swe_bad_options_are_one_line(capsys, tmp_path, argv, needle):
  try:
    status = cli.main(["mine", str(tmp_path), "--out", str(tmp_path / "o"), *argv])
  except SystemExit as e:  # argparse's own errors exit from the parser
    status = e.code
  assert status == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err and needle in err, err


def test_mine_swe_of_a_path_that_is_no_repository(capsys, tmp_path):
  assert cli.main(["mine", str(tmp_path / "nothing"), "--tasks", "swe",
                   "--out", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "does not exist" in err


def test_session_mounts_and_environment_are_checked_before_anything_starts(tmp_path):
  from rlcode.sandbox.session import Session
  for mounts in ({"/usr/lib/x": str(tmp_path)}, {"/opt/python": str(tmp_path)},
                 {"/opt/a/../b": str(tmp_path)}, {"/opt/env": str(tmp_path / "absent")}):
    with pytest.raises(ValueError, match="mounts"):
      Session(mounts=mounts)
  with pytest.raises(ValueError, match="env"):
    Session(env={"not a name": "x"})


def test_the_test_environment_copies_what_it_is_asked_and_leaves_out_the_rest(tmp_path):
  from rlcode.swe import testenv
  env = testenv.build(["pympler", "no-such-distribution-rlcode"], root=str(tmp_path))
  assert {"pytest", "pluggy", "pympler"} <= set(env.versions)
  assert env.missing == ("no-such-distribution-rlcode",)
  assert os.path.isfile(os.path.join(env.path, testenv.PLUGIN_MODULE + ".py"))
  assert os.path.isdir(os.path.join(env.path, "pympler"))
  assert oct(os.stat(env.path).st_mode & 0o777) == "0o755"
  # Compiled as it is built: the sandbox's interpreter reads pytest from its .pyc (the
  # mount is read-only, so it could not write one), and the modules of a distribution
  # with a pytest plugin have pytest's rewritten .pyc.
  from rlcode.sandbox.session import Session
  plugin = testenv.build(["hypothesis"], root=str(tmp_path))
  assert list(Path(plugin.path, "hypothesis", "__pycache__").glob("core.*-pytest-*.pyc"))
  # (in the default root, which the sessions' user can reach; tmp_path is private)
  with Session(mounts={testenv.MOUNT: testenv.build([]).path}) as session:
    out = session.exec(f"PYTHONPATH={testenv.MOUNT} python3 -S -v -c 'import pytest' 2>&1").output
  assert f"code object from '{testenv.MOUNT}/pytest/__pycache__/__init__." in out
  shadowed = testenv.build(["pympler"], root=str(tmp_path), exclude={"pympler"})
  assert "pympler" not in shadowed.versions and shadowed.path != env.path
  # A distribution whose extension modules the interpreter cannot load is left out; one
  # built for it is copied.
  import importlib.metadata as metadata
  native = sorted(testenv.canonical(d.metadata["Name"]) for d in metadata.distributions()
                  if any(str(f).endswith(".so") for f in d.files or ()))[0]
  found, _, compiled = testenv.resolve([native], suffixes=(".no-such-abi.so",))
  assert native in compiled and native not in found
  real = testenv.extension_suffixes(sys.executable)
  found, _, compiled = testenv.resolve([native], suffixes=real)
  assert native in found and native not in compiled


@pytest.mark.parametrize("ids,parser,misread", [
    (["t.py::a[x y]", "t.py::b"], "parse_log_pytest_v2", []),
    (["t.py::a[12m]", "t.py::b"], "parse_log_pytest", []),
    (["t.py::a[12m x]"], "parse_log_pytest_v2", ["t.py::a[12m x]"]),
    (["t.py::a[x  y]", "t.py::c[1\tz]"], "parse_log_pytest_v2",
     ["t.py::a[x  y]", "t.py::c[1\tz]"]),
])
def test_the_export_names_the_swebench_parser_that_reads_its_ids_whole(ids, parser, misread):
  from swebench.harness.log_parsers import PARSER_REGISTRY
  assert export.log_parser(ids) == (parser, misread)
  # Checked against the parser itself: the ids it reads back whole are the others.
  for node in ids:
    read = PARSER_REGISTRY[parser](f"PASSED {node}\nFAILED {node}x", None)
    assert (read.get(node) == "PASSED") is (node not in misread), node
  assert export.image_name("owner__name-3") == "swebench/sweb.eval.x86_64.owner_1776_name-3:latest"


def test_the_declared_version_is_read_from_metadata_or_the_package():
  assert deps.declared_version({"pyproject.toml": '[project]\nversion = "1.2"\n'}) == "1.2"
  assert deps.declared_version({"setup.cfg": "[metadata]\nversion = 3.0\n"}) == "3.0"
  assert deps.declared_version({"setup.cfg": "[metadata]\nversion = attr: p.V\n",
                                "setup.py": "setup(version='0.9')\n"}) == "0.9"
  assert deps.declared_version({"src/p/__init__.py": "__version__ = '4.5.6'\n"}) == "4.5.6"
  assert deps.declared_version({"p/q/__init__.py": "__version__ = '7'\n",
                                "pyproject.toml": "[broken"}) == ""
