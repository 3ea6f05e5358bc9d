"""One PR's verdict: its runs at both commits, FAIL_TO_PASS and PASS_TO_PASS, validation.

A test passes when pytest reports it passed or xfailed (SWE-bench's PASSED and XFAIL);
failing, erring, skipping or being absent (its file did not collect) is not passing.
FAIL_TO_PASS are the tests that pass after the PR (the base with the test and code
patches) and not before it (the base with the test patch); PASS_TO_PASS pass at both.

`judge` decides from the two runs, raising `Skip` with the first reason that applies:
timeout, crash or sandbox_error (either run did not finish; a run that pytest itself ended
before any test, its conftest.py failing to import or its options refused, is judged by
what it printed instead: the reasons below, or pytest_error), pytest_error (pytest itself
failed after the PR: a usage or internal error), then, when no test passes after the PR,
why: missing_dependency (a module neither the repository nor the test environment has),
python_version (a syntax error, or a standard-library name this Python lacks),
collection_error (any other collection failure) or no_passing_test; and no_fail_to_pass.

`empty_fails` and `gold_passes` are SWE-bench's check: the gold patch through the reward's
path (rlcode.swe.tasks.evaluation_tree) must pass every FAIL_TO_PASS and PASS_TO_PASS test,
and the empty patch must fail every FAIL_TO_PASS test. The trees are those of the first
runs (a gold tree that is not the PR's is "patch_error"), so the after run is the reward's
run of the gold patch; then the empty patch runs once more and the gold patch
`gold_runs - 1` more times (each a new attempt, never a cached copy, with its own
PYTHONHASHSEED, rlcode.swe.runner; `random` is seeded anew by every interpreter), each on
the FAIL_TO_PASS tests' functions, and each must agree with the first. A FAIL_TO_PASS test
that fails in a fraction p of runs is so seen passing `gold_runs` times with probability
(1 - p) ** gold_runs: 0.6 ** 8 = 1.7% for a test that fails 4 runs in 10 (more-itertools'
test_vs_statistics_median, whose random fractions can have a zero denominator), where two
runs let it through 36% of the time. PASS_TO_PASS tests are seen passing twice (before and
after, at hash seed 0): repeating them would rerun the whole changed test files (a
more-itertools test_more.py run takes 8 s, its FAIL_TO_PASS functions 0.5 s), so a
PASS_TO_PASS test that fails 4 runs in 10 escapes 36% of the time. A difference is
flakiness ("flaky"). Hypothesis tests are derandomized in every run (the reward's too),
so repeats do not vary them.

This module must not read git nor walk histories: it judges runs.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

from rlcode.swe.history import Skip
from rlcode.swe.runner import TestRun

_MISSING = re.compile(r"No module named '([\w.]+)'")
_STDLIB_NAME = re.compile(r"cannot import name '\w+' from '([\w.]+)'")
# pytest's exit statuses for an internal error and a usage error.
PYTEST_FAILED = (3, 4)


def collection_reason(messages: Iterable[str], tree_modules: frozenset[str]) -> tuple[str, str]:
  """(reason, detail) of collection errors: missing_dependency (the module's name),
  python_version, or collection_error (the end of the first message)."""
  messages = list(messages)
  for text in messages:
    for name in _MISSING.findall(text):
      top = name.split(".", 1)[0]
      if top in sys.stdlib_module_names:
        return "python_version", f"no standard module {name}"
      if top not in tree_modules:
        return "missing_dependency", top
  for text in messages:
    if "SyntaxError" in text:
      return "python_version", "SyntaxError"
    for name in _STDLIB_NAME.findall(text):
      if name.split(".", 1)[0] in sys.stdlib_module_names:
        return "python_version", f"a name {name} no longer has"
  last = messages[0].strip().splitlines()[-1] if messages and messages[0].strip() else ""
  return "collection_error", last[:200]


def early_failure(run: TestRun, tree_modules: frozenset[str]) -> tuple[str, str] | None:
  """(reason, detail) of a run that pytest ended before any test (its report never
  began: a conftest.py that does not import, refused options), from its output; None for
  any other run."""
  if run.status != "crash" or run.outcomes or run.collect_errors:
    return None
  if "while loading conftest" in run.output:
    return collection_reason([run.output], tree_modules)
  if ("ERROR: usage:" in run.output or "INTERNALERROR" in run.output
      or "/_pytest/" in run.output and "Failed: " in run.output):
    return "pytest_error", run.output.strip().splitlines()[-1][:200]
  return None


def judge(before: TestRun, after: TestRun, tree_modules: frozenset[str]
          ) -> tuple[frozenset[str], frozenset[str]]:
  """(FAIL_TO_PASS, PASS_TO_PASS) of a PR's two runs; raises Skip (module docstring)."""
  for run in (before, after):
    if run.status != "ok":
      early = early_failure(run, tree_modules)
      if run is after and early is not None:
        raise Skip(*early)
      if early is None:
        raise Skip(run.status, run.output[-200:])
  if after.exit_status in PYTEST_FAILED:
    raise Skip("pytest_error", f"exit status {after.exit_status}: {after.output[-200:]}")
  passing_after = after.passing()
  if not passing_after:
    if after.collect_errors:
      raise Skip(*collection_reason(after.collect_errors.values(), tree_modules))
    raise Skip("no_passing_test")
  passing_before = before.passing()
  fail_to_pass = passing_after - passing_before
  if not fail_to_pass:
    raise Skip("no_fail_to_pass")
  return fail_to_pass, passing_after & passing_before


def functions(node_ids: Iterable[str]) -> tuple[str, ...]:
  """The test functions of node ids, parameters cut off (`f.py::C::t[1]` -> `f.py::C::t`),
  sorted: what pytest can select whatever characters a parameter's id holds."""
  return tuple(sorted({n.split("[", 1)[0] for n in node_ids}))


def empty_fails(fail_to_pass: frozenset[str], empty: TestRun) -> None:
  """Raises Skip("flaky") unless the empty patch's second run fails every FAIL_TO_PASS
  test; Skip(status) when that run did not end (a timeout is the machine's, not a flake)."""
  _ended(empty)
  passed = fail_to_pass & empty.passing()
  if passed:
    raise Skip("flaky", f"the empty patch passes {sorted(passed)[0]} ({len(passed)} tests)")


def gold_passes(fail_to_pass: frozenset[str], gold: TestRun, run: int, runs: int) -> None:
  """Raises Skip("flaky") unless the gold patch's run number `run` (of `runs`, the after
  run being the first) passes every FAIL_TO_PASS test. (That the after run passes every
  FAIL_TO_PASS and PASS_TO_PASS test is `judge`'s construction.) A run that did not end is
  Skip(its status), not a flake."""
  _ended(gold)
  missed = fail_to_pass - gold.passing()
  if missed:
    raise Skip("flaky", f"gold fails {sorted(missed)[0]} ({len(missed)} tests) in run "
                        f"{run} of {runs}")


def _ended(run: TestRun) -> None:
  if run.status != "ok":
    raise Skip(run.status, run.output[-200:])


def runners_agree(fail_to_pass: frozenset[str], after: TestRun, isolated: TestRun) -> None:
  """Raises Skip("runners_disagree") unless the second runner (rlcode.swe.crosscheck, each
  test in its own interpreter, its verdict read from outside it) saw every FAIL_TO_PASS
  test's function return where pytest's after run reported it passed, and raise where
  pytest reported it xfailed. A second run that ran out of time (rlcode.swe.crosscheck's
  budget) says nothing of the tests: Skip("timeout")."""
  if isolated.status == "timeout":
    raise Skip("timeout", f"the second runner ran out of time after {isolated.seconds:.0f} s "
                          f"({sum(o != 'error' for o in isolated.outcomes.values())} of "
                          f"{len(fail_to_pass)} tests judged)")
  for test in sorted(fail_to_pass):
    expected = "failed" if after.outcomes.get(test) == "xfailed" else "passed"
    seen = isolated.outcomes.get(test, "error")
    if seen != expected:
      said = "returned" if seen == "passed" else "raised" if seen == "failed" else (
          f"gave no verdict ({isolated.status})")
      raise Skip("runners_disagree", f"pytest: {test} {after.outcomes.get(test)}; in its own "
                                     f"interpreter its function {said}")
