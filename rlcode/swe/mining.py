"""The miner of executable PR tasks: a history's PRs, their tests run, judged, validated.

For each PR that changes code and tests (rlcode.swe.history), on `workers` threads:
read its trees; run the test modules it changes (those that exist after it) with pytest
in the sandbox, on the base with its test patch and on the base with its test and code
patches (rlcode.swe.runner); judge the two runs (FAIL_TO_PASS, PASS_TO_PASS, or why not:
rlcode.swe.validate); validate the kept ones with more runs of the gold and empty
patches through the reward's path, on their FAIL_TO_PASS tests (the empty patch once
more, the gold patch `gold_runs` times in all); make the task
(rlcode.swe.tasks). Each PR gives one verdict: a task, or the first skip reason
(rlcode.swe.config.SKIP_REASONS), so tasks + skipped = PRs walked. The PRs with the
largest test modules start first.

Caching by commit: a PR's verdict is stored under a hash of its commit, the config
fields that decide it, the runner's and plugin's versions and the sandbox's
interpreter, with the versions of the test environment its runs used; a rerun reads the
verdicts whose test environment would be the same today and runs nothing for them (a
changed dependency reruns its PRs); each pytest run is cached as well
(rlcode.swe.runner).

Splits: the latest `test_fraction` of the tasks by PR time are "test" (ties at the
cutoff go to test), the latest `validation_fraction` before them "validation" (to tune
on, so that test is read once), the rest "train".

This module must not score answers (rlcode.rewards.swe) nor print (rlcode.swe.command).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import math
import os
import posixpath
import re
import secrets
import sys
import threading
import time
from typing import Any

import tqdm

from rlcode.data import edits
from rlcode.data.git import filters
from rlcode.data.git.repo import Git, GitError, checkout, is_bundle
from rlcode.data.tasks import Task
from rlcode.sandbox import session
from rlcode.swe import crosscheck, deps, history, patches, tasks, testenv, validate
from rlcode.swe.config import NOT_RUNNABLE, REPO_NAME, SKIP_REASONS, SweConfig
from rlcode.swe.runner import RUNNER_VERSION, Runner, RunSpec, TestRun

VERDICT_VERSION = "7"  # bump when a change here or in validate or deps changes verdicts
_VALIDATION = ("patch_error", "flaky", "runners_disagree")


@dataclasses.dataclass
class SweResult:
  """The validated tasks by split, the report, and each PR's verdict (sha, reason, ...)."""

  splits: dict[str, list[Task]]
  report: dict[str, Any]
  verdicts: list[dict[str, Any]]

  @property
  def tasks(self) -> list[Task]:
    return sorted((t for ts in self.splits.values() for t in ts), key=lambda t: t.id)


def repo_name(config: SweConfig, git: Git | None = None) -> str:
  """`owner/name`: config.repo_name, else the last two parts of the origin URL of `git`
  (a local repository's; a bundle's clone has the bundle as its origin), else `local/`
  and the source's file name without .bundle/.git."""
  if config.repo_name:
    return config.repo_name
  if git is not None and not is_bundle(config.source):
    try:
      url = git.run("config", "--get", "remote.origin.url").decode().strip()
    except (GitError, UnicodeDecodeError):
      url = ""
    name = "/".join(re.split(r"[/:]", url.removesuffix("/").removesuffix(".git"))[-2:])
    if REPO_NAME.fullmatch(name):
      return name
  base = posixpath.basename(config.source.rstrip("/"))
  for suffix in (".bundle", ".git"):
    base = base.removesuffix(suffix)
  name = f"local/{base}"
  return name if REPO_NAME.fullmatch(name) else "local/repo"


def instance_id(name: str, position: int) -> str:
  """SWE-bench's `owner__name-N`; N is the PR's position on the first-parent chain (the
  root commit is 1): every PR has one, unlike a PR number, and it does not change as the
  history grows."""
  return f"{name.replace('/', '__')}-{position}"


@functools.lru_cache(maxsize=1)
def _interpreter() -> tuple[str, tuple[str, ...]]:
  python = session.interpreter_path()
  return testenv.python_version(python), testenv.extension_suffixes(python)


def _verdict_key(config: SweConfig, sha: str) -> str:
  decides = {k: v for k, v in dataclasses.asdict(config).items()
             if k not in ("branch", "max_commits", "workers", "test_fraction",
                          "validation_fraction")}
  what = [VERDICT_VERSION, RUNNER_VERSION, sha, decides, _interpreter(),
          hashlib.sha256(testenv.PLUGIN_SOURCE.encode()).hexdigest()]
  return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _env_of(test_deps, tree_modules) -> dict:
  env = testenv.build(test_deps, exclude=tree_modules)
  return {"deps": list(test_deps), "exclude": sorted(tree_modules), "versions": env.versions}


def _still_valid(verdict: dict) -> bool:
  """Whether a cached verdict's runs would see the same test environment today."""
  env = verdict.get("test_env")
  return env is None or _env_of(env["deps"], env["exclude"])["versions"] == env["versions"]


def _changed_lines(base: dict[str, str], after: dict[str, str | None]) -> int:
  return sum(filters.changed_lines(base.get(p, ""), t or "") for p, t in after.items())


class _Evaluator:
  """One PR at a time per thread: its trees, runs, judgement and validation."""

  def __init__(self, config: SweConfig, reader: history.Reader, runner: Runner,
               positions: dict[str, int]):
    self.config, self.reader, self.runner = config, reader, runner
    self.positions = positions

  def spec(self, tree, test_files, test_deps, python_path, attempt) -> RunSpec:
    return RunSpec(tree, tuple(test_files), tuple(test_deps), tuple(python_path),
                   self.config.timeout, self.config.hypothesis_examples, attempt)

  def _rerun(self, full: RunSpec, fail_to_pass: frozenset[str]) -> TestRun:
    """`full` on the FAIL_TO_PASS tests' functions, or on the whole files when pytest
    cannot select them. A timed-out run is not cached: on a busy machine it is the
    machine's, and the next pass runs it again."""
    run = self.runner.run(dataclasses.replace(full, tests=validate.functions(fail_to_pass)),
                          cache_timeouts=False)
    if run.exit_status in validate.PYTEST_FAILED:
      run = self.runner.run(full, cache_timeouts=False)
    return run

  def __call__(self, cand: history.Candidate) -> dict[str, Any]:
    verdict: dict[str, Any] = {"sha": cand.sha, "time": cand.commit.time, "runnable": False,
                               "kept": False, "validated": False}
    try:
      verdict.update(self._evaluate(cand, verdict))
      verdict["reason"] = None
    except history.Skip as s:
      verdict.update(reason=s.reason, detail=s.detail[:300])
    except GitError as e:  # an object git cannot give: the PR's files are unusable
      verdict.update(reason="unusable_file", detail=str(e)[:300])
    return verdict

  def _evaluate(self, cand: history.Candidate, verdict: dict) -> dict:
    config = self.config
    trees = self.reader.trees(cand)
    if (_changed_lines(trees.base, trees.code_after) + _changed_lines(trees.base, trees.tests_after)
        > config.max_changed_lines):
      raise history.Skip("too_large")
    test_files = sorted(p for p, t in trees.tests_after.items()
                        if t is not None and patches.is_test_module(p))
    if not test_files:
      raise history.Skip("no_test_module")
    before_tree, after_tree = trees.before, trees.after
    # One environment for both runs, as the reward has one for every answer (and SWE-bench
    # one image per instance): what the base declares, what the PR's commit declares (its
    # configuration files are in neither patch, so in neither tree: a PR that moves its
    # requirements from setup.py to pyproject.toml declares them in one or the other), and
    # what the trees declare. The base's count: an answer starts from the base, and a test
    # that fails before the PR only for want of a dependency the base declares (six, in
    # more-itertools' "Drop Python 2.7 support") is not a FAIL_TO_PASS test.
    test_deps = sorted(set(deps.declared_deps(before_tree)) | set(deps.declared_deps(after_tree))
                       | set(deps.declared_deps(self.reader.tree(cand.sha)))
                       | set(config.extra_test_deps))
    verdict["test_deps"] = test_deps
    verdict["test_env"] = _env_of(test_deps, deps.top_level_names(after_tree))
    python_path = deps.python_path(after_tree)
    spec = functools.partial(self.spec, test_files=test_files, test_deps=test_deps,
                             python_path=python_path)
    before = self.runner.run(spec(before_tree, attempt=0))
    after = self.runner.run(spec(after_tree, attempt=0))
    f2p, p2p = validate.judge(before, after, deps.top_level_names(after_tree))
    verdict.update(runnable=True, kept=True)
    gold_patch = patches.render(trees.base, trees.code_after)
    test_patch = patches.render(trees.base, trees.tests_after)
    try:
      gold_tree = tasks.evaluation_tree(trees.base, test_patch,
                                        patches.apply(trees.base, gold_patch))
      empty_tree = tasks.evaluation_tree(trees.base, test_patch, {})
    except edits.FormatError as e:
      raise history.Skip("patch_error", str(e)) from None
    if gold_tree != after_tree or empty_tree != before_tree:
      raise history.Skip("patch_error", "the patches do not rebuild the PR's trees")
    # The after run is the reward's own run of the gold patch (the same tree and spec, so
    # the same cached run); the runs after it, of the empty patch once and of the gold
    # patch until a failure or gold_runs in all, are of the FAIL_TO_PASS tests' functions
    # alone, each attempt with its own hash seed (rlcode.swe.validate).
    validate.empty_fails(f2p, self._rerun(spec(empty_tree, attempt=1), f2p))
    for attempt in range(1, config.gold_runs):
      validate.gold_passes(f2p, self._rerun(spec(gold_tree, attempt=attempt), f2p),
                           attempt + 1, config.gold_runs)
    # pytest's report is written inside the interpreter the gold code runs in; the second
    # runner reads each FAIL_TO_PASS test's verdict from outside its own (one sandbox, one
    # interpreter a test).
    isolated = crosscheck.cached(self.runner, dataclasses.replace(
        spec(gold_tree, attempt=0), tests=tuple(sorted(f2p))))
    validate.runners_agree(f2p, after, isolated)
    try:
      task = tasks.make_task(
          instance_id=instance_id(config.repo_name, self.positions[cand.sha]),
          request=cand.request, repo=config.source, repo_name=config.repo_name,
          base_commit=cand.base, commit=cand.sha,
          time=cand.commit.time, base=trees.base, code_after=trees.code_after,
          tests_after=trees.tests_after, fail_to_pass=f2p, pass_to_pass=p2p,
          test_files=test_files, test_deps=test_deps, python_path=python_path,
          hypothesis_examples=config.hypothesis_examples, timeout=config.timeout,
          edit_format=config.edit_format, gold_runs=config.gold_runs)
    except ValueError as e:
      raise history.Skip("patch_error", str(e)) from None
    return {"validated": True, "task": task.to_example(),
            "fail_to_pass": len(f2p), "pass_to_pass": len(p2p)}


def _load(path: str) -> dict | None:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _store(path: str, verdict: dict) -> None:
  tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
  with open(tmp, "w") as f:
    json.dump(verdict, f)
  os.replace(tmp, path)


def worker_count(config: SweConfig) -> int:
  """The PRs evaluated at once: config.workers, else one more than the CPUs this process
  may use (a PR's runs leave a CPU idle while a sandbox starts, a report is read back or
  a test sleeps; one PR more fills those gaps: more-itertools' pass went from 178% to
  194% of 2 CPUs, with the order below)."""
  if config.workers:
    return config.workers
  try:
    cpus = len(os.sched_getaffinity(0))
  except AttributeError:
    cpus = os.cpu_count() or 1
  return max(1, cpus) + 1


def _largest_first(todo: list[history.Candidate], blobs) -> list[int]:
  """The order to start the candidates in: by the bytes of the test modules they run,
  largest first, so that the longest PRs do not start last and leave the other workers
  idle at the end (longest-processing-time-first; a PR's time grows with its tests)."""
  def size(c: history.Candidate) -> int:
    return sum(blobs.size(new) or 0 for path, (_, new, _) in c.changes.items()
               if new is not None and patches.is_test_module(path))
  sizes = [size(c) for c in todo]
  return sorted(range(len(todo)), key=lambda i: -sizes[i])


def split_by_time(found: list[Task], fraction: float,
                  validation_fraction: float = 0.0) -> dict[str, list[Task]]:
  """train and test: the latest `fraction` of the tasks by PR time are test (ties at the
  cutoff too); with `validation_fraction`, the latest that fraction of all tasks before
  test form "validation" (ties at its cutoff too, short of test's)."""
  names = ("train", "validation", "test") if validation_fraction else ("train", "test")
  out: dict[str, list[Task]] = {name: [] for name in names}
  if not found:
    return out
  times = sorted(t.extra.time for t in found)
  cut = lambda share: times[len(times) - math.ceil(share * len(times))] if share else None
  test, validation = cut(fraction), cut(fraction + validation_fraction)
  for t in sorted(found, key=lambda t: t.id):
    if test is not None and t.extra.time >= test:
      out["test"].append(t)
    elif validation_fraction and t.extra.time >= validation:
      out["validation"].append(t)
    else:
      out["train"].append(t)
  return out


def mine(config: SweConfig, revision: str | None = None, *, cache_dir: str | None = None,
         use_cache: bool = True, progress: bool = False) -> SweResult:
  """Mines `config.source` into validated executable tasks (module docstring).

  The report (JSON-serialisable) holds: `walked` (first-parent commits, each one PR),
  `with_tests` (PRs that change code and tests), `runnable` (their tests ran to a result
  at both commits), `kept` (at least one FAIL_TO_PASS test), `validated`, `skipped` by
  reason (SKIP_REASONS order), `skip_details` (examples per reason), `skip_times` (the
  first and last PR time per reason), `tasks` per split, the runs made and cached, the
  wall-clock seconds and the test environment (interpreter, versions).

  Raises:
    rlcode.data.git.SourceError: a source that is not a repository or bundle, an unknown
      branch or an empty history (one line, for the CLI).
  """
  start = time.monotonic()
  git = Git(checkout(config.source))
  config = dataclasses.replace(config, repo_name=repo_name(config, git))
  head = git.resolve(revision or config.branch)
  commits = git.first_parent_log(head, config.max_commits)
  first = int(git.run("rev-list", "--first-parent", "--count", head)) - len(commits) + 1
  positions = {c.sha: first + i for i, c in enumerate(commits)}
  cache = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "rlcode", "swe")
  root = os.path.join(cache, "verdicts")
  if use_cache:
    os.makedirs(root, exist_ok=True)
  runner = Runner(os.path.join(cache, "runs"), use_cache)
  verdicts: list[dict] = []
  todo: list[history.Candidate] = []
  for item in history.candidates(git, commits):
    if isinstance(item, history.Skip):
      verdicts.append({"reason": item.reason, "detail": item.detail, "runnable": False,
                       "kept": False, "validated": False})
      continue
    cached = _load(os.path.join(root, _verdict_key(config, item.sha) + ".json")) if use_cache \
        else None
    if cached is not None and _still_valid(cached):
      verdicts.append(cached)
    else:
      todo.append(item)
  counts = collections.Counter()
  lock = threading.Lock()
  bar = tqdm.tqdm(total=len(todo), desc="swe tasks", unit="PR", file=sys.stderr,
                  disable=not progress or not todo)
  with git.blobs() as blobs:
    evaluate = _Evaluator(config, history.Reader(git, blobs), runner, positions)

    def one(cand: history.Candidate) -> dict:
      verdict = evaluate(cand)
      if use_cache and verdict["reason"] not in ("sandbox_error",):
        _store(os.path.join(root, _verdict_key(config, cand.sha) + ".json"), verdict)
      with lock:
        counts["tasks" if verdict["validated"] else "skipped"] += 1
        bar.set_postfix(counts, refresh=False)
        bar.update()
      return verdict

    order = _largest_first(todo, blobs)
    with concurrent.futures.ThreadPoolExecutor(worker_count(config)) as pool:
      futures = {i: pool.submit(one, todo[i]) for i in order}
      verdicts += [futures[i].result() for i in range(len(todo))]
  bar.close()
  found = [Task.from_example(v["task"]) for v in verdicts if v.get("validated")]
  splits = split_by_time(found, config.test_fraction, config.validation_fraction)
  env = testenv.build(sorted({d for v in verdicts for d in v.get("test_deps", ())}))
  report = _report(config, head, commits, verdicts, splits, runner, env,
                   time.monotonic() - start)
  return SweResult(splits, report, [{k: v for k, v in d.items() if k != "task"}
                                    for d in verdicts])


def _report(config, head, commits, verdicts, splits, runner, env, seconds) -> dict:
  skipped = collections.Counter(v["reason"] for v in verdicts if v["reason"])
  details: dict[str, list[str]] = collections.defaultdict(list)
  times: dict[str, list[int]] = {}
  for v in verdicts:
    reason = v["reason"]
    if not reason:
      continue
    if v.get("detail") and len(details[reason]) < 3 and v["detail"] not in details[reason]:
      details[reason].append(v["detail"])
    if "time" in v:
      lo, hi = times.get(reason, (v["time"], v["time"]))
      times[reason] = [min(lo, v["time"]), max(hi, v["time"])]
  with_tests = (len(verdicts) - skipped["root_commit"] - skipped["no_test_change"]
                - skipped["no_code_change"])
  return {
      "source": config.source, "branch": config.branch, "head": head,
      "repo_name": config.repo_name,
      "walked": len(commits), "with_tests": with_tests,
      "runnable": sum(v["runnable"] for v in verdicts),
      "kept": sum(v["kept"] for v in verdicts),
      "validated": sum(v["validated"] for v in verdicts),
      "skipped": {r: skipped[r] for r in SKIP_REASONS if skipped[r]},
      "not_runnable": sum(skipped[r] for r in NOT_RUNNABLE),
      "skip_details": dict(details), "skip_times": times,
      "tasks": {name: len(ts) for name, ts in splits.items()},
      "fail_to_pass": sum(v.get("fail_to_pass", 0) for v in verdicts if v["validated"]),
      "pass_to_pass": sum(v.get("pass_to_pass", 0) for v in verdicts if v["validated"]),
      "runs": runner.ran, "runs_cached": runner.cached, "run_seconds": round(runner.seconds, 1),
      "seconds": round(seconds, 1), "workers": worker_count(config),
      "timeout": config.timeout, "hypothesis_examples": config.hypothesis_examples,
      "gold_runs": config.gold_runs,
      "python": testenv.python_version(session.interpreter_path()),
      "test_environment": env.versions, "test_deps_missing": list(env.missing),
      "test_deps_compiled": list(env.compiled),
  }
