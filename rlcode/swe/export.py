"""Executable PR tasks in SWE-bench's JSON-lines format, written and read back.

Each line is one instance with SWE-bench's fields: instance_id (`owner__name-N`, the
task's id), repo (`owner/name`), base_commit, patch, test_patch, problem_statement,
hints_text (""), created_at (the PR's commit time, ISO 8601 UTC), version (the version the
base declares, rlcode.swe.deps.declared_version, else "0"), FAIL_TO_PASS and PASS_TO_PASS
(lists of pytest node ids that run from the repository's root) and
environment_setup_commit (the base commit), so the file loads with SWE-bench's own
`load_swebench_dataset`; and the fields swebench 5's harness needs to evaluate an
instance (`swebench.harness.utils.make_test_spec`):
- image: the instance-level image name the harness derives for the instance id
  (`swebench/sweb.eval.x86_64.<id>:latest`, lower case, "__" as "_1776_"). No such image
  is published: one is built with the repository at /testbed at the base commit and a
  python3 with pytest and the task's test dependencies.
- eval_script: the tests run as rlcode runs them (rlcode.swe.runner): the test files reset
  to the base and the test patch applied, then pytest on the task's test files from
  /testbed with rlcode's report plugin (written by the script itself), hash seed 0 and the
  task's hypothesis budget, between SWE-bench's output markers; after pytest, one line
  `STATUS node_id` per test from the plugin's report (PASSED, FAILED, ERROR, SKIPPED,
  XFAIL; a test one of whose subtests failed is FAILED), a command that exits with
  pytest's exit status (swebench 5 records the status of the command before the end
  marker as the tests'); then the test files are reset, the script's temporary folder
  (under $TMPDIR, else /tmp) is removed, and the script exits with pytest's exit status,
  not the reset's. pytest's own summary is not what grades: pytest 9 reports a
  unittest test whose subTest failed as PASSED (with SUBFAILED lines), which SWE-bench's
  parsers read as passed; the report's lines come last, so they are what the parser keeps.
  What differs from rlcode's reward: SWE-bench resets only the test patch's files, where
  the reward drops every change an answer makes to a test path or a site hook
  (rlcode.swe.tasks.evaluation_tree), and the image's python runs with its site module.
- log_parser: "parse_log_pytest_v2" (it keeps node ids with spaces whole), or
  "parse_log_pytest" when an id holds what v2 strips (`[12m`, control characters); an id
  neither reads back whole (a space and one of those) is listed in rlcode's
  "misread_ids": SWE-bench grades it failed whatever its outcome.
- eval_type: "pass_and_fail".
Our own fields ride in one more key, "rlcode": where the history lives, the PR's commit,
the test files, test dependencies, import path, hypothesis budget, timeout, time, edit
format and how many gold runs validated it.

`read` makes Tasks again: the prompt and reference are rebuilt from the history (the base
texts of the files the patch touches), so write then read gives the same tasks. A line
without "rlcode" (an instance from elsewhere) needs `repo`, the history to read; its test
files are the test modules its test patch leaves, and its dependencies and import path
are read from the repository after the patches (rlcode.swe.deps).

This module must not mine or run tests.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shlex
from collections.abc import Iterable

from rlcode.data.jsonl import json_objects
from rlcode.data.tasks import Task
from rlcode.errors import BadInput
from rlcode.swe import deps, patches, tasks, testenv

FILE_NAME = "swe_tasks.jsonl"
FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
          "hints_text", "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS",
          "environment_setup_commit", "image", "eval_script", "log_parser", "eval_type")
_OURS = ("repo", "commit", "test_files", "test_deps", "python_path", "hypothesis_examples",
         "timeout", "time", "edit_format", "gold_runs")
WORKDIR = "/testbed"
EVAL_TYPE = "pass_and_fail"
START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
# What parse_log_pytest_v2 removes from a line before it splits it (terminal colours,
# control characters); parse_log_pytest keeps only the line's second word.
_V2_STRIPS = re.compile(r"\[\d+m|[\x01-\x1f]")
# The plugin's outcomes as SWE-bench's statuses (an xpassed test fails, as in strict xfail).
STATUSES = {"passed": "PASSED", "failed": "FAILED", "error": "ERROR", "skipped": "SKIPPED",
            "xfailed": "XFAIL", "xpassed": "FAILED"}
_PRINT_STATUSES = f"""import json, sys
path, nonce, status = sys.argv[1], sys.argv[2], int(sys.argv[3])
names, passing = {STATUSES!r}, ("PASSED", "XFAIL")
try:
  lines = open(path, encoding="utf-8").read().splitlines()
except OSError:
  lines = []
out = {{}}
for line in lines:
  try:
    r = json.loads(line)
  except ValueError:
    continue
  if isinstance(r, dict) and r.get("n") == nonce and r.get("e") == "test" \\
      and isinstance(r.get("id"), str) and r.get("o") in names:
    if out.get(r["id"], "PASSED") in passing:
      out[r["id"]] = names[r["o"]]
for node, status_ in out.items():
  print(status_, node)
sys.exit(status)
"""


def image_name(instance_id: str) -> str:
  """The instance-level image name SWE-bench's harness derives for an instance id."""
  return f"swebench/sweb.eval.x86_64.{instance_id}:latest".lower().replace("__", "_1776_")


def log_parser(node_ids: Iterable[str]) -> tuple[str, list[str]]:
  """(the SWE-bench log parser that reads the most of these ids back whole, the ids it
  misreads) (module docstring)."""
  node_ids = list(node_ids)
  v2 = [n for n in node_ids if _V2_STRIPS.search(n) or n.split() != n.split(" ")]
  if not v2:
    return "parse_log_pytest_v2", []
  plain = [n for n in node_ids if len(n.split()) != 1 or n.split()[0] != n]
  return ("parse_log_pytest", plain) if len(plain) < len(v2) else ("parse_log_pytest_v2", v2)


def _heredoc(command: str, text: str) -> list[str]:
  """`command <<'END'` with `text`, under a delimiter that is no line of `text`."""
  tag = "EOF_" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:12]
  while tag in text.splitlines():
    tag += "_"
  return [f"{command} <<'{tag}'", text.rstrip("\n"), tag]


def _base_paths(patch: str) -> list[str]:
  """The paths a patch changes that exist before it (its `--- a/...` headers)."""
  return sorted({line[6:] for line in patch.splitlines() if line.startswith("--- a/")})


def eval_script(task: Task, workdir: str = WORKDIR) -> str:
  """The task's SWE-bench eval script (module docstring), run from `workdir`."""
  x = task.extra
  q = shlex.quote
  reset = (f"git checkout {x.base_commit} -- " + " ".join(q(p) for p in
                                                          _base_paths(x.test_patch))
           if _base_paths(x.test_patch) else ":")
  path = ":".join(['"$r"'] + [q(workdir if p == "." else f"{workdir}/{p}")
                              for p in x.python_path])
  env = {"RLCODE_PYTEST_REPORT": '"$r/report.jsonl"', "RLCODE_PYTEST_NONCE": '"$nonce"',
         "PYTHONHASHSEED": "0", "PYTHONPATH": path}
  if x.hypothesis_examples:
    env["RLCODE_HYPOTHESIS_EXAMPLES"] = str(x.hypothesis_examples)
  pytest = ["python3", "-m", "pytest", "-p", testenv.PLUGIN_MODULE, "-p", "no:cacheprovider",
            f"--rootdir={q(workdir)}", "--continue-on-collection-errors", "-q", "--no-header",
            "--tb=line", "-o", "console_output_style=classic"] + [q(t) for t in x.test_files]
  lines = ["#!/bin/bash", "set -uxo pipefail", f"cd {q(workdir)}", reset,
           *_heredoc("git apply -v -", x.test_patch),
           "r=$(mktemp -d)",
           # Removed however the script ends, so an evaluation leaves no folder behind.
           "trap 'rm -rf \"$r\"' EXIT",
           *_heredoc(f'cat > "$r/{testenv.PLUGIN_MODULE}.py"', testenv.PLUGIN_SOURCE),
           *_heredoc('cat > "$r/statuses.py"', _PRINT_STATUSES),
           "nonce=$(python3 -c 'import secrets; print(secrets.token_hex(16))')",
           f": '{START}'",
           " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(pytest),
           "pytest_status=$?",
           'python3 "$r/statuses.py" "$r/report.jsonl" "$nonce" "$pytest_status"',
           f": '{END}'", reset, 'exit "$pytest_status"']
  return "\n".join(lines) + "\n"


def to_row(task: Task, base: dict[str, str] | None = None) -> dict:
  """A task as one SWE-bench instance (module docstring); `base`: its base files, read
  from the history when not given."""
  x = task.extra
  created = datetime.datetime.fromtimestamp(x.time, datetime.timezone.utc)
  parser, misread = log_parser(x.fail_to_pass + x.pass_to_pass)
  ours = {k: (list(v) if isinstance(v, tuple) else v)
          for k, v in ((k, getattr(x, k)) for k in _OURS)}
  if misread:
    ours["misread_ids"] = misread
  version = deps.declared_version(base if base is not None else tasks.base_files(task))
  return {
      "instance_id": task.id, "repo": x.repo_name, "base_commit": x.base_commit,
      "patch": x.patch, "test_patch": x.test_patch,
      "problem_statement": tasks.request_of(task), "hints_text": "",
      "created_at": created.isoformat().replace("+00:00", "Z"), "version": version or "0",
      "FAIL_TO_PASS": list(x.fail_to_pass), "PASS_TO_PASS": list(x.pass_to_pass),
      "environment_setup_commit": x.base_commit, "image": image_name(task.id),
      "eval_script": eval_script(task), "log_parser": parser, "eval_type": EVAL_TYPE,
      "rlcode": ours,
  }


def write(path: str, tasks_: Iterable[Task]) -> int:
  """Writes the tasks (sorted by id) as JSON lines; returns how many."""
  rows = [to_row(t) for t in sorted(tasks_, key=lambda t: t.id)]
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, sort_keys=True) + "\n")
  os.replace(tmp, path)
  return len(rows)


def _node_ids(value, where: str, name: str) -> list[str]:
  if isinstance(value, str):  # SWE-bench's datasets on the Hub store them JSON-encoded
    try:
      value = json.loads(value)
    except ValueError:
      raise BadInput(f"{where}: {name} is neither a list nor a JSON list") from None
  if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
    raise BadInput(f"{where}: {name} must be a list of node ids")
  return value


def from_row(row: dict, where: str = "row", repo: str | None = None) -> Task:
  """The Task of one instance (module docstring)."""
  missing = [f for f in ("instance_id", "repo", "base_commit", "patch", "test_patch",
                         "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS") if f not in row]
  if missing:
    raise BadInput(f"{where}: no field {missing[0]!r}")
  ours = row.get("rlcode")
  if ours is None:
    if repo is None:
      raise BadInput(f"{where}: an instance without our 'rlcode' fields needs repo= (the "
                     "history to read its files from)")
    ours = {"repo": repo, "commit": "", "time": 0, "edit_format": "unified_diff"}
  elif not isinstance(ours, dict):
    raise BadInput(f"{where}: 'rlcode' must be an object")
  ours = dict(ours)
  if repo is not None:
    ours["repo"] = repo
  probe = Task(id=row["instance_id"], prompt="", kind="swe", extra={
      "repo": ours["repo"], "base_commit": row["base_commit"]})
  try:
    base = tasks.base_files(probe)
    code_after = patches.apply(base, row["patch"])
    tests_after = patches.apply(base, row["test_patch"])
  except ValueError as e:
    raise BadInput(f"{where}: {e}") from None
  after = patches.applied(patches.applied(dict(base), row["test_patch"]), row["patch"])
  test_files = ours.get("test_files") or sorted(
      p for p, t in tests_after.items() if t is not None and patches.is_test_module(p))
  return tasks.make_task(
      instance_id=row["instance_id"], request=row["problem_statement"], repo=ours["repo"],
      repo_name=row["repo"], base_commit=row["base_commit"], commit=ours.get("commit", ""),
      time=int(ours.get("time", 0)), base=base, code_after=code_after,
      tests_after=tests_after,
      fail_to_pass=_node_ids(row["FAIL_TO_PASS"], where, "FAIL_TO_PASS"),
      pass_to_pass=_node_ids(row["PASS_TO_PASS"], where, "PASS_TO_PASS"),
      test_files=test_files,
      test_deps=ours.get("test_deps", deps.declared_deps(after)),
      python_path=ours.get("python_path", deps.python_path(after)),
      hypothesis_examples=int(ours.get("hypothesis_examples", 0)),
      timeout=float(ours.get("timeout", 120.0)),
      edit_format=ours.get("edit_format", "unified_diff"),
      gold_runs=int(ours.get("gold_runs", 0)))


def read(path: str, repo: str | None = None) -> list[Task]:
  """The tasks of a SWE-bench JSON-lines file, sorted by id; `repo` overrides (or, for
  instances without our fields, gives) the history their files are read from."""
  out = [from_row(row, where, repo) for where, row in json_objects(path)]
  return sorted(out, key=lambda t: t.id)

