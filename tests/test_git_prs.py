"""PR units, cached bundle clones, windows of large files and `rlcode mine`.

Histories are built here with merge commits whose every unit is known, and
every task is checked against `git show`: its context and oracle are the
files of the commit it names, before and after.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from git_repos import Repo

from rlcode import cli
from rlcode.data import edits
from rlcode.data.git import (CACHE_ENV, BundleError, GitDiffs, MiningConfig, checkout, mine,
                             pr_request)
from rlcode.data.git.excerpts import window
from rlcode.data.tasks import load_tasks
from rlcode.rewards import diffs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
A0 = "".join(f"a{i} = {i}\n" for i in range(20))
B0 = "".join(f"b{i} = {i}\n" for i in range(20))


@pytest.fixture(autouse=True)
def _bundle_cache(tmp_path, monkeypatch):
  monkeypatch.setenv(CACHE_ENV, str(tmp_path / "git-cache"))


def _pr_history(repo: Repo) -> dict[str, str]:
  """Squash commits, a merged PR of two commits, a merged PR whose branch merged main."""
  shas = {"root": repo.commit("Start", {"a.py": A0, "b.py": B0})}
  shas["squash"] = repo.commit("Set a1 to one (#3)", {"a.py": A0.replace("a1 = 1", "a1 = 'one'")})
  a1 = repo.show("HEAD", "a.py")
  repo.git("checkout", "-q", "-b", "feat")
  shas["c1"] = repo.commit("Rename a5", {"a.py": a1.replace("a5 = 5", "five = 5")})
  shas["c2"] = repo.commit("Use five in b", {
      "a.py": a1.replace("a5 = 5", "five = 5").replace("a15 = 15", "a15 = five * 3"),
      "b.py": B0.replace("b2 = 2", "b2 = 2 + 0")})
  repo.git("checkout", "-q", "main")
  shas["main"] = repo.commit("Touch b19", {"b.py": B0.replace("b19 = 19", "b19 = 19.0")})
  repo.time += 100
  repo.git("merge", "-q", "--no-ff", "-m",
           "Merge pull request #7 from someone/feat\n\nUse a name for five", "feat")
  shas["merge"] = repo.git("rev-parse", "HEAD")
  repo.git("checkout", "-q", "-b", "side")
  shas["c3"] = repo.commit("Side work", {"b.py": repo.show("HEAD", "b.py") + "side = 1\n"})
  repo.git("checkout", "-q", "main")
  shas["main2"] = repo.commit("Name a19", {
      "a.py": repo.show("HEAD", "a.py").replace("a19 = 19", "a19 = 'nineteen'")})
  repo.git("checkout", "-q", "side")
  repo.time += 100
  repo.git("merge", "-q", "--no-ff", "-m", "Merge branch 'main' into side", "main")
  repo.git("checkout", "-q", "main")
  repo.time += 100
  repo.git("merge", "-q", "--no-ff", "-m", "Merge branch 'side'", "side")
  shas["side_merge"] = repo.git("rev-parse", "HEAD")
  return shas


@pytest.fixture(scope="module")
def prs(tmp_path_factory):
  repo = Repo(tmp_path_factory.mktemp("prs") / "repo")
  return repo, _pr_history(repo)


def _by_id(repo, granularity, **kw):
  result = mine(MiningConfig(source=str(repo.path), granularity=granularity,
                             test_fraction=0.0, **kw))
  return {t.id: t for t in result.splits["train"]}, result.report


def _check_against_git(repo: Repo, task):
  """The context is the named commit's files with the unit undone; the oracle its files."""
  sha, files, oracle = task.extra.commit, task.extra.files, task.extra.oracle
  for path, content in {**files, **oracle}.items():
    assert repo.show(sha, path) == content, (task.id, path)
  assert diffs.score(task.reference, files, oracle, task.extra.edit_format) == 1.0


def test_a_merge_is_one_pr_against_its_first_parent(prs):
  repo, shas = prs
  tasks, report = _by_id(repo, "pr")
  assert sorted(tasks) == sorted(shas[k] for k in ("root", "squash", "main", "merge", "main2",
                                                   "side_merge"))
  assert report["prs"] == {"merge": 2, "single_commit": 4}
  merge = tasks[shas["merge"]]
  before = {p: repo.show(f"{shas['merge']}^1", p) for p in ("a.py", "b.py")}
  assert merge.extra.files == before
  assert merge.extra.oracle == {p: repo.show(shas["merge"], p) for p in ("a.py", "b.py")}
  # The title without GitHub's subject line, then the commits' messages, oldest first.
  request = merge.prompt.split("--- BEGIN REQUEST ---\n")[1].split("\n--- END REQUEST")[0]
  assert request == "Use a name for five\n\nRename a5\n\nUse five in b"
  # The main-line change made while the PR was open is in its context, not its oracle.
  assert "b19 = 19.0" in merge.extra.files["b.py"]
  for task in tasks.values():
    _check_against_git(repo, task)


def test_commit_units_are_the_merged_commits_against_their_own_parents(prs):
  repo, shas = prs
  tasks, report = _by_id(repo, "commit")
  # The squash commit is its own commit unit; the merged PR gives c1 and c2;
  # the side PR gives c3 and drops the merge of main into its branch.
  assert sorted(tasks) == sorted(shas[k] for k in ("root", "squash", "main", "c1", "c2",
                                                   "main2", "c3"))
  assert report["units_dropped"] == {"merge": 1}
  c2 = tasks[shas["c2"]]
  assert c2.extra.pr == shas["merge"] and c2.extra.commit == shas["c2"]
  # c2's context is its own parent, c1: the earlier commit of the PR is applied,
  # the main-line change made meanwhile is not.
  assert "five = 5" in c2.extra.files["a.py"]
  assert "b19 = 19.0" not in c2.extra.files["b.py"]
  assert "BEGIN REQUEST ---\nUse five in b\n--- END" in c2.prompt
  for task in tasks.values():
    _check_against_git(repo, task)
  squash_pr = _by_id(repo, "pr")[0][shas["squash"]]
  squash = tasks[shas["squash"]]
  assert (squash.prompt, squash.extra.files, squash.extra.oracle) == (
      squash_pr.prompt, squash_pr.extra.files, squash_pr.extra.oracle)


def test_file_and_hunk_units_have_the_rest_of_their_pr_applied(prs):
  repo, shas = prs
  merge = shas["merge"]
  files, _ = _by_id(repo, "file")
  a_unit = files[f"{merge}:a.py"]
  assert a_unit.extra.files["a.py"] == repo.show(f"{merge}^1", "a.py")
  assert a_unit.extra.files["b.py"] == repo.show(merge, "b.py")
  assert "BEGIN APPLIED CHANGES" in a_unit.prompt
  hunks, report = _by_id(repo, "hunk")
  # c1 and c2 change a.py in two places: two hunks, each with the other applied.
  h1, h2 = hunks[f"{merge}:a.py#1"], hunks[f"{merge}:a.py#2"]
  assert "five = 5" not in h1.extra.files["a.py"] and "a15 = five" in h1.extra.files["a.py"]
  assert "five = 5" in h2.extra.files["a.py"] and "a15 = five" not in h2.extra.files["a.py"]
  for task in [*files.values(), *hunks.values()]:
    assert task.extra.pr == task.extra.commit
    _check_against_git(repo, task)
  assert report["units"] == {"pr": 6, "commit": 7, "file": 8, "hunk": 9}


def test_all_units_of_a_pr_go_to_its_split(prs):
  repo, shas = prs
  result = mine(MiningConfig(source=str(repo.path), granularity="commit", test_fraction=0.4))
  test = {t.id for t in result.splits["test"]}
  # The three latest PRs are held out, the merges with every commit they bring
  # in, although "main" (train) was committed after c1 and c2.
  assert test == {shas["c1"], shas["c2"], shas["main2"], shas["c3"]}
  assert shas["main"] in {t.id for t in result.splits["train"]}


@pytest.mark.parametrize("message,commits,want", [
    ("Merge pull request #12 from a/b\n\nFix x", ["Fix x", "Add y"], "Fix x\n\nAdd y"),
    ("Merge branch 'fix-x'", ["Fix x"], "Fix x"),
    ("Merge branch 'fix-x' into main", [], ""),
    ("Merge remote-tracking branch 'origin/dev'\n\nDev work", [], "Dev work"),
    ("Bring in the parser", ["Lex", "Parse"], "Bring in the parser\n\nLex\n\nParse"),
])
def test_pr_request(message, commits, want):
  assert pr_request(message, commits) == want


def _bundle(repo: Repo, path) -> str:
  repo.git("bundle", "create", "-q", str(path), "HEAD", "main")
  return str(path)


def test_bundle_clones_are_cached_by_content(prs, tmp_path):
  repo, _ = prs
  cache = tmp_path / "cache"
  bundle = _bundle(repo, tmp_path / "one.bundle")
  clone = checkout(bundle, str(cache))
  open(os.path.join(clone, "rlcode-test-marker"), "w").close()
  # Reused (the marker survives), also from a copy of the bundle elsewhere.
  copy = shutil.copy(bundle, tmp_path / "copy.bundle")
  assert checkout(str(copy), str(cache)) == clone
  assert os.path.exists(os.path.join(clone, "rlcode-test-marker"))
  direct = mine(MiningConfig(source=str(repo.path), test_fraction=0.0))
  bundled = mine(MiningConfig(source=bundle, test_fraction=0.0), cache_dir=str(cache))
  assert bundled.splits == direct.splits
  assert sorted(os.listdir(cache)) == [os.path.basename(clone)]
  # Another bundle content, another clone; a corrupt bundle leaves nothing.
  other = Repo(tmp_path / "other")
  other.commit("x", {"x.py": "x = 1\n"})
  assert checkout(_bundle(other, tmp_path / "two.bundle"), str(cache)) != clone
  data = (tmp_path / "one.bundle").read_bytes()
  (tmp_path / "cut.bundle").write_bytes(data[:len(data) // 2])
  with pytest.raises(BundleError, match="not a git bundle"):
    checkout(str(tmp_path / "cut.bundle"), str(cache))
  assert len(os.listdir(cache)) == 2


def _expand(text: str, lines: list[str]) -> str:
  """`text` with every window marker replaced by the lines it stands for."""
  out = []
  for line in text.splitlines(keepends=True):
    m = re.fullmatch(r"\[\.\.\. lines (\d+)-(\d+) not shown \.\.\.\]\n", line)
    out += lines[int(m[1]) - 1:int(m[2])] if m else [line]
  return "".join(out)


def test_windows_are_the_same_edit_of_the_same_lines():
  pre = "".join(f"x{i % 7} = {i}\n" for i in range(200))
  post = pre.replace("x3 = 10\n", "x3 = 'ten'\n").replace("x0 = 140\n", "")
  post = post.replace("x3 = 199\n", "x3 = 199\ntail = 1\n")
  pre_w, post_w = window(pre, post, 3)
  lines = edits.split_keepends(pre)
  assert _expand(pre_w, lines) == pre and _expand(post_w, lines) == post
  # Three changes, each with the 3 lines either side that exist; 3 markers.
  assert len(pre_w.splitlines()) == 7 + 7 + 3 + 3
  assert re.findall(r"lines (\d+-\d+) not shown", pre_w) == ["1-7", "15-137", "145-197"]
  assert post_w.endswith("x3 = 199\ntail = 1\n")


def test_large_files_are_cut_to_windows_not_skipped(tmp_path):
  repo = Repo(tmp_path / "big")
  big = "".join(f"def f{i}():\n  return {i}\n\n" for i in range(400))  # ~9 kB
  repo.commit("Start", {"big.py": big, "small.py": "s = 1\n"})
  sha = repo.commit("Return 'one' from f1 and 3.0 from f300", {
      "big.py": big.replace("return 1\n", "return 'one'\n").replace("return 300\n",
                                                                    "return 3.0\n"),
      "small.py": "s = 2\n"})
  config = dict(source=str(repo.path), test_fraction=0.0, max_file_bytes=2_000,
                window_lines=4)
  tasks = {t.id: t for t in mine(MiningConfig(granularity="hunk", **config)).splits["train"]}
  report = mine(MiningConfig(**config)).report
  # Adding the 1200-line file is too many lines; the change to it is kept.
  assert report["files_cut"] == 1 and report["commits_skipped"] == {"too_many_lines": 1}
  h1 = tasks[f"{sha}:big.py#1"]
  cut = h1.extra.files["big.py"]
  assert len(cut) < 500 and cut.count("not shown") == 2
  lines = edits.split_keepends(repo.show(f"{sha}~1", "big.py"))
  assert _expand(h1.extra.oracle["big.py"], lines) == repo.show(sha, "big.py")
  assert _expand(cut, lines) == repo.show(sha, "big.py").replace("return 'one'\n",
                                                                 "return 1\n")
  for task in tasks.values():
    assert diffs.score(task.reference, task.extra.files, task.extra.oracle) == 1.0
  # Windows still above the budget, or a file above the hard cap: skipped.
  assert mine(MiningConfig(**{**config, "window_lines": 200})).report[
      "commits_skipped"] == {"too_many_lines": 1, "cut_too_large": 1}
  assert mine(MiningConfig(**{**config, "hard_max_file_bytes": 5_000})).report[
      "commits_skipped"] == {"file_too_large": 2}


def test_more_itertools_prs_are_mined_with_its_large_module_cut():
  # The latest first-parent commits of the real history: merged PRs, most of
  # them touching more_itertools/more.py (170 kB), which used to skip them.
  result = mine(MiningConfig(source=os.path.join(ROOT, "data/repos/more-itertools.bundle"),
                             max_commits=12, test_fraction=0.0))
  report = result.report
  assert report["prs"]["merge"] >= 10 and report["files_cut"] > 0
  assert "file_too_large" not in report["commits_skipped"]
  assert report["units"]["pr"] == report["commits_kept"] >= 10
  for task in result.splits["train"]:
    assert diffs.score(task.reference, task.extra.files, task.extra.oracle) == 1.0


def _mine_cli(capsys, *args: str) -> tuple[int, str, str]:
  rc = cli.main(["mine", *args])
  out, err = capsys.readouterr()
  return rc, out, err


def test_cli_mines_prints_the_table_and_writes_the_datasets(prs, tmp_path, capsys):
  repo, shas = prs
  rc, out, err = _mine_cli(capsys, f"{repo.path}@main", "--out", str(tmp_path / "tfds"),
                           "--granularity", "pr", "--granularity", "hunk",
                           "--test-fraction", "0.4", "--edit-format", "line_edit")
  assert rc == 0, err
  lines = out.strip().splitlines()
  assert lines[-1] == "units: pr=6 commit=7 file=8 hunk=9"
  assert re.search(r"^walked \(first-parent commits\) +6$", out, re.M)
  assert re.search(r"^train / test PRs +3 / 3$", out, re.M)
  assert re.search(r"^hunk tasks: train / test +4 / 5$", out, re.M)
  assert "mining" in err  # the progress bar
  builder = GitDiffs(data_dir=str(tmp_path / "tfds"), mining=MiningConfig(
      source=str(repo.path), branch="main", granularity="hunk", test_fraction=0.4,
      edit_format="line_edit"))
  tasks = load_tasks(builder, "test")
  assert len(tasks) == 5
  assert {t.extra.edit_format for t in tasks} == {"line_edit"}
  assert all("<<<<<<< LINES " in t.reference for t in tasks)
  assert builder.build_report()["granularity"] == "hunk"


def _shallow(repo: Repo, tmp_path) -> str:
  clone = tmp_path / "shallow"
  subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo.path}", str(clone)],
                 check=True, env=repo.env(), capture_output=True)
  return str(clone)


@pytest.mark.parametrize("case,message", [
    ("not_a_repository", "is not a git repository"),
    ("missing", "does not exist"),
    ("unknown_branch", "branch 'nope' is not a commit"),
    ("shallow", "is a shallow clone"),
    ("empty", "has no commits"),
    ("corrupt_bundle", "not a git bundle"),
])
def test_cli_bad_input_is_one_line_and_exit_2(prs, tmp_path, capsys, case, message):
  repo, _ = prs
  if case == "not_a_repository":
    (tmp_path / "plain").mkdir()
    source = str(tmp_path / "plain")
  elif case == "missing":
    source = str(tmp_path / "missing")
  elif case == "unknown_branch":
    source = f"{repo.path}@nope"
  elif case == "shallow":
    source = _shallow(repo, tmp_path)
  elif case == "empty":
    source = str(Repo(tmp_path / "empty").path)
  else:
    raw = open(_bundle(repo, tmp_path / "ok.bundle"), "rb").read()
    (tmp_path / "bad.bundle").write_bytes(raw[:len(raw) * 2 // 3])
    source = str(tmp_path / "bad.bundle")
  rc, out, err = _mine_cli(capsys, source, "--out", str(tmp_path / "tfds"))
  assert rc == 2 and out == ""
  assert err.endswith("\n") and err.count("\n") == 1, err
  assert err.startswith("rlcode mine: error: ") and message in err
  assert "Traceback" not in err

