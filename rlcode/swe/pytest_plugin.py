"""The pytest plugin that reports each test's outcome from inside the sandbox.

rlcode never imports this file: rlcode.swe.testenv copies its text into the test
environment as the module `rlcode_pytest_report`, and rlcode.swe.runner starts pytest
with `-p rlcode_pytest_report`. Standard library and pytest only.

It appends one JSON line per event to the file named by $RLCODE_PYTEST_REPORT, flushed
as it goes, so a run killed by its wall clock still leaves what finished:
  {"n": NONCE, "e": "collect_error", "id": NODEID, "msg": TEXT}   a file failed to collect
  {"n": NONCE, "e": "test", "id": NODEID, "o": OUTCOME}           a test ended
  {"n": NONCE, "e": "done", "status": EXIT_STATUS}                the session ended
OUTCOME is passed, failed, error (setup or teardown failed), skipped, xfailed or
xpassed; a test one of whose subtests (unittest's subTest, pytest's subtests) failed is
failed. $RLCODE_PYTEST_NONCE is read and removed from the environment when the plugin
loads, before any test module is imported, so that a stray line written by a test does
not count; the tests share this interpreter, so the nonce guards against accidents, not
against a test that means to forge the report (rlcode.swe.runner says what is trusted;
rlcode.swe.crosscheck is the check that does not read this report).

Hypothesis, when the tests imported it, is made deterministic once collection ends
(derandomize, no example database, no deadline, no health checks), so that two runs of
one tree agree and a loaded machine does not fail a test on time; with
$RLCODE_HYPOTHESIS_EXAMPLES it also runs that many examples a test (a time budget).
"""

import json
import os
import sys

import pytest

_NONCE = os.environ.pop("RLCODE_PYTEST_NONCE", "")
_PATH = os.environ.pop("RLCODE_PYTEST_REPORT", "")
_EXAMPLES = os.environ.pop("RLCODE_HYPOTHESIS_EXAMPLES", "")
_MAX_MESSAGE = 2000
_outcomes = {}
_failed_subtests = set()
_out = None


def _emit(record):
  global _out
  if not _PATH:
    return
  if _out is None:
    _out = open(_PATH, "a", encoding="utf-8")
  record["n"] = _NONCE
  _out.write(json.dumps(record) + "\n")
  _out.flush()


def _text(longrepr):
  try:
    text = str(longrepr)
  except Exception:  # noqa: BLE001 (a report that cannot print is still an error)
    text = "unprintable error"
  return text[-_MAX_MESSAGE:]


def pytest_collectreport(report):
  if report.failed:
    _emit({"e": "collect_error", "id": report.nodeid, "msg": _text(report.longrepr)})


def pytest_runtest_logreport(report):
  was_xfail = hasattr(report, "wasxfail")
  if type(report).__name__ == "SubtestReport":
    if report.failed:
      _failed_subtests.add(report.nodeid)
    return
  if report.when == "call":
    if report.passed:
      outcome = "xpassed" if was_xfail else "passed"
    elif report.skipped:
      outcome = "xfailed" if was_xfail else "skipped"
    else:
      outcome = "failed"
    _outcomes[report.nodeid] = outcome
  elif report.failed:  # setup or teardown
    _outcomes[report.nodeid] = "error"
  elif report.when == "setup" and report.skipped:
    _outcomes[report.nodeid] = "xfailed" if was_xfail else "skipped"


def pytest_runtest_logfinish(nodeid, location):
  outcome = _outcomes.pop(nodeid, "error")
  if nodeid in _failed_subtests and outcome in ("passed", "xfailed", "xpassed"):
    outcome = "failed"
  _emit({"e": "test", "id": nodeid, "o": outcome})


def deterministic_hypothesis():
  """Makes hypothesis, when imported, deterministic (the module docstring's settings).
  rlcode.swe.crosscheck's runner calls it too, so that both runners run the same
  examples."""
  if "hypothesis" not in sys.modules:
    return
  try:
    from hypothesis import HealthCheck, settings
    budget = {"max_examples": int(_EXAMPLES)} if _EXAMPLES.isdigit() else {}
    settings.register_profile("rlcode", derandomize=True, database=None, deadline=None,
                              suppress_health_check=list(HealthCheck), print_blob=False,
                              **budget)
    settings.load_profile("rlcode")
  except Exception:  # noqa: BLE001 (an old hypothesis without these settings runs as is)
    pass


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
  deterministic_hypothesis()


def pytest_sessionfinish(session, exitstatus):
  _emit({"e": "done", "status": int(exitstatus)})
  if _out is not None:
    _out.close()
