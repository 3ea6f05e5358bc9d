"""Unit-test rewards: a completion scores by the tests of its task, run in the sandbox.

Registers two rewards:
  "tests": runs each assembled program against its task's tests in
    `rlcode.sandbox` and scores 1/0 (mode "all") or the fraction of tests passed
    (mode "fraction"; 0 unless the harness reported every test).
  "format": a cheap, sandbox-free well-formedness score (see `format_reward`).

How a program is assembled from a Task and a completion (`assemble_program`),
chosen by `task.extra.assemble`:
  "prompt+completion" (default, HumanEval style): the completion continues the
    prompt (a signature and docstring) with the function body; it is cut at the
    first stop sequence (HUMANEVAL_STOP by default: HumanEval's, so that helper
    code, tests or prints the model appends after the function are dropped) and
    the program is `task.prompt + completion`. The prompt's other top-level
    code (`given_code`: imports, helpers) runs with the tests as trusted context.
  "chat": a chat model's answer (rlcode.data.chat_prompts): its first python block (as
    for "completion") is the whole function, run after the imports of the function
    head it was asked to complete (`extra.code_prompt`), whose other code runs with the
    tests as trusted context as for "prompt+completion".
  "completion": the completion is the whole program; if it contains a fenced
    block (```python, ```py, ```python3, or an untagged ```), the first python
    block (else the first untagged one) is the program, otherwise all of it.
  "files" (diff tasks with tests, rlcode.data.git.units): the completion is an
    edit answer, applied to `extra.files` (rlcode.data.edits); the program
    makes those files and `extra.support_files` importable by their paths
    (`toolkit/prices.py` as `toolkit.prices`) and runs the tests' imports of
    them, which leave the tests (`files_job`), so the tests only call what
    the program defines. An answer that does not apply runs a program that
    raises, so it scores 0.

Which tests run (`test_set`): "hidden" is `task.tests`; "visible" is
`extra.tests_visible`, the weaker tests a diff task may also carry.

Untrusted code is only parsed here (`ast.parse`, never executed); running it is
the sandbox's business.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from rlcode import pyast, sandbox
from rlcode.data import edits
from rlcode.data.tasks import Task
from rlcode.rewards.config import FORMAT_CHECKS, HUMANEVAL_STOP, TEST_SETS
from rlcode.rewards.registry import RewardOutput, register, register_answer_end

ASSEMBLE_STYLES = ("prompt+completion", "completion", "files", "chat")
_PYTHON_TAGS = ("python", "python3", "py")
# Larger sources are not parsed: they fail "parses" outright.
_MAX_PARSE_CHARS = 1 << 20
_FENCE = re.compile(r"^```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:^```[ \t]*$|\Z)",
                    re.DOTALL | re.MULTILINE)


def truncate_at_stops(completion: str, stop_sequences: Sequence[str]) -> tuple[str, str]:
  """Splits `completion` at the earliest stop sequence: (kept, cut off)."""
  cut = min((i for i in (completion.find(s) for s in stop_sequences if s) if i >= 0),
            default=len(completion))
  return completion[:cut], completion[cut:]


def extract_code(completion: str) -> tuple[str, str]:
  """The program in a whole-program completion: (code, text outside the block).

  The first ```python/```py/```python3 block, else the first untagged block; an
  unclosed fence runs to the end. Without such a block: (completion, "").
  """
  blocks = [(m.group(1).lower(), m) for m in _FENCE.finditer(completion)]
  chosen = (next((m for tag, m in blocks if tag in _PYTHON_TAGS), None)
            or next((m for tag, m in blocks if not tag), None))
  if chosen is None:
    return completion, ""
  start, end = chosen.span()
  return chosen.group(2), completion[:start] + completion[end:]


# Serves the program's files as modules: a meta path finder over a dict.
_FILES_LOADER = """
import importlib.abc as _abc, importlib.util as _util, sys as _sys


class _FilesFinder(_abc.MetaPathFinder, _abc.Loader):

  def __init__(self, files):
    self.files = files

  def find_spec(self, name, path=None, target=None):
    base = name.replace(".", "/")
    for file, package in ((base + "/__init__.py", True), (base + ".py", False)):
      if file in self.files:
        return _util.spec_from_loader(name, self, origin=file, is_package=package)
    if any(f.startswith(base + "/") for f in self.files):
      return _util.spec_from_loader(name, self, origin=None, is_package=True)
    return None

  def create_module(self, spec):
    return None

  def exec_module(self, module):
    file = module.__spec__.origin
    if file is not None:
      module.__file__ = file
      exec(compile(self.files[file], file, "exec"), module.__dict__)


_sys.meta_path.insert(0, _FilesFinder(__rlcode_files__))
"""


def split_file_imports(tests: str, files: Iterable[str]) -> tuple[str, str]:
  """(the top-level imports in `tests` of modules among `files`, the tests without them).

  Those imports belong in the program: the tests then only use names the
  program defines, which is all a sandbox that keeps the tests apart from the
  program lets them see. Tests that do not parse are returned whole.
  """
  roots = {path.split("/")[0].removesuffix(".py") for path in files}
  try:
    body = pyast.parse(tests).body
  except SyntaxError:
    return "", tests
  lines = tests.splitlines(keepends=True)
  moved = [False] * len(lines)
  for stmt in body:
    if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
      modules = [stmt.module]
    elif isinstance(stmt, ast.Import):
      modules = [a.name for a in stmt.names]
    else:
      continue
    if all(m.split(".")[0] in roots for m in modules):
      moved[stmt.lineno - 1:stmt.end_lineno] = [True] * (stmt.end_lineno - stmt.lineno + 1)
  return ("".join(l for l, m in zip(lines, moved) if m),
          "".join(l for l, m in zip(lines, moved) if not m))


def files_job(files: Mapping[str, str], tests: str, tests_format: str = "auto") -> sandbox.Job:
  """The job that runs `tests` against `files` (path -> Python source), importable by path."""
  imports, rest = split_file_imports(tests, files)
  program = f"__rlcode_files__ = {dict(sorted(files.items()))!r}\n" + _FILES_LOADER + imports
  return sandbox.Job(program=program, tests=rest, tests_format=tests_format)


def _files_job(task: Task, completion: str, tests: str) -> sandbox.Job:
  files = {**task.extra.support_files, **task.extra.files}
  try:
    edited = edits.apply_completion(completion, task.extra.files, task.extra.edit_format,
                                    task.extra.open_file, task.extra.shown_lines)
  except edits.FormatError as e:
    job = files_job(files, tests, task.extra.tests_format)
    return dataclasses.replace(
        job, program=f"raise RuntimeError({'the answer does not apply: ' + str(e)!r})\n")
  return files_job({**files, **edited}, tests, task.extra.tests_format)


def _style(task: Task) -> str:
  style = task.extra.assemble
  if style not in ASSEMBLE_STYLES:
    raise ValueError(f"task {task.id!r}: extra.assemble must be one of "
                     f"{ASSEMBLE_STYLES}, got {style!r}")
  return style


def _parts(task: Task, completion: str,
           stop_sequences: Sequence[str]) -> tuple[str, str, str]:
  """(program, the completion's code, stray text removed from the completion)."""
  if _style(task) == "files":
    return _files_job(task, completion, task.tests).program, completion, ""
  if _style(task) == "prompt+completion":
    code, stray = truncate_at_stops(completion, stop_sequences)
    return task.prompt + code, code, stray
  code, stray = extract_code(completion)
  if _style(task) == "chat":
    return _imports(task.extra.code_prompt) + code, code, stray
  return code, code, stray


def _imports(source: str) -> str:
  """The top-level import statements of `source`, one a line ("" if it does not parse)."""
  tree = _parse(source)
  if tree is None:
    return ""
  lines = [ast.get_source_segment(source, s) for s in tree.body
           if isinstance(s, (ast.Import, ast.ImportFrom))]
  return "".join(f"{line}\n" for line in lines if line)


def assemble_program(task: Task, completion: str, *,
                     stop_sequences: Sequence[str] = HUMANEVAL_STOP) -> str:
  """The program to run for `completion` of `task` (see the module docstring)."""
  return _parts(task, completion, stop_sequences)[0]


def _parse(source: str) -> ast.Module | None:
  """The AST of `source`, None when it does not parse or passes _MAX_PARSE_CHARS."""
  if len(source) > _MAX_PARSE_CHARS:
    return None
  try:
    return pyast.parse(source)
  except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
    return None


def _binds(stmt: ast.stmt) -> set[str]:
  if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
    return {stmt.name}
  if isinstance(stmt, (ast.Import, ast.ImportFrom)):
    return {(a.asname or a.name).split(".")[0] for a in stmt.names}
  return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _uses(node: ast.AST) -> set[str]:
  return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


@functools.lru_cache(maxsize=4096)
def _given_code(prompt: str, entry_point: str, tests: str) -> str:
  prompt_tree, tests_tree = _parse(prompt), _parse(tests)
  if prompt_tree is None or tests_tree is None:
    return ""
  defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
  completed = next((s for s in reversed(prompt_tree.body) if isinstance(s, defs)), None)
  candidates = [s for s in prompt_tree.body
                if s is not completed and not (isinstance(s, defs) and s.name == entry_point)]
  # What the tests use, and what that needs in turn (a helper's imports, say).
  needed, kept = _uses(tests_tree), set()
  grew = True
  while grew:
    grew = False
    for stmt in candidates:
      if id(stmt) not in kept and _binds(stmt) & needed:
        kept.add(id(stmt))
        needed |= _uses(stmt)
        grew = True
  body = [s for s in candidates if id(s) in kept]
  return ast.unparse(ast.Module(body, [])) if body else ""


def given_code(task: Task, tests: str | None = None) -> str:
  """The prompt code a task's tests use, run with them as trusted context (`Job.context`).

  Of the prompt's top-level statements other than the definition the
  completion continues (the last one) and the entry point's: those that bind a
  name the tests use, and what those need in turn (HumanEval/32: `poly` and its
  `import math`). The tests use these, never the program's versions, so a
  completion cannot redefine what checks it. Empty when the tests use none, for
  whole-program tasks, and when the prompt or the tests do not parse. `tests`: the
  test source that will run (default: the task's hidden tests).
  """
  if _style(task) == "chat":
    return _given_code(task.extra.code_prompt, task.entry_point,
                       task.tests if tests is None else tests)
  if _style(task) != "prompt+completion":
    return ""
  return _given_code(task.prompt, task.entry_point, task.tests if tests is None else tests)


def job_for(task: Task, completion: str, *,
            stop_sequences: Sequence[str] = HUMANEVAL_STOP,
            test_set: str = "hidden") -> sandbox.Job:
  """The sandbox job for one completion of a "code" task, or of a "diff" task with tests."""
  if task.kind != "code" and not (task.kind == "diff" and _style(task) == "files"):
    raise ValueError(f"task {task.id!r} has kind {task.kind!r}; test rewards need kind 'code' "
                     "or a 'diff' task with tests (extra.assemble == 'files')")
  if test_set not in TEST_SETS:
    raise ValueError(f"test_set must be one of {TEST_SETS}, got {test_set!r}")
  tests = task.tests if test_set == "hidden" else task.extra.tests_visible
  if not tests.strip():
    what = "tests" if test_set == "hidden" else "visible tests"
    raise ValueError(f"task {task.id!r} has no {what}")
  if _style(task) == "files":
    return _files_job(task, completion, tests)
  return sandbox.Job(
      program=assemble_program(task, completion, stop_sequences=stop_sequences),
      tests=tests, entry_point=task.entry_point,
      tests_format=task.extra.tests_format, context=given_code(task, tests))


@register_answer_end("tests")
def tests_answer_end(task: Task, completion: str, *,
                     stop_sequences: Sequence[str] = HUMANEVAL_STOP, **_) -> int:
  """Characters of `completion` the program is assembled from: up to the first stop
  sequence for prompt+completion tasks, all of it for whole-program completions."""
  if _style(task) == "prompt+completion":
    return len(truncate_at_stops(completion, tuple(stop_sequences))[0])
  return len(completion)


def _limits(options: dict) -> sandbox.Limits:
  names = {f.name for f in dataclasses.fields(sandbox.Limits)}
  unknown = sorted(set(options) - names)
  if unknown:
    raise TypeError(f"unknown option(s) {unknown}; valid: mode, stop_sequences, test_set, "
                    f"workers, and the sandbox limits {sorted(names)}")
  return sandbox.Limits(**options)


@register("tests")
def tests_reward(tasks: Sequence[Task], completions: Sequence[str], *, mode: str = "all",
                 stop_sequences: Sequence[str] = HUMANEVAL_STOP, workers: int | None = None,
                 test_set: str = "hidden", **limits) -> RewardOutput:
  """Scores completions by their task's unit tests, run in the sandbox.

  Args:
    tasks: one "code" task per completion.
    completions: decoded completion texts.
    mode: "all" (1 if every test passed, else 0) or "fraction" (tests passed /
      tests total, counted only from a complete report; else 0).
    stop_sequences: where prompt+completion completions are cut.
    workers: sandbox runs in parallel; default all CPUs.
    test_set: "hidden" (`task.tests`) or "visible" (`extra.tests_visible`).
    **limits: fields of `rlcode.sandbox.Limits` (wall_seconds, cpu_seconds,
      memory_bytes, ...).

  Returns:
    scores in [0, 1]; metrics pass_rate, fraction and status/<s> (share of
    completions per status, every status present); details per completion.
  """
  if mode not in ("all", "fraction"):
    raise ValueError(f"mode must be 'all' or 'fraction', got {mode!r}")
  if len(tasks) != len(completions):
    raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
  stops = tuple(stop_sequences)
  jobs = [job_for(t, c, stop_sequences=stops, test_set=test_set)
          for t, c in zip(tasks, completions)]
  results = sandbox.Sandbox(_limits(limits), workers=workers).run_many(jobs)
  passed = np.array([r.passed for r in results], np.float32)
  fraction = np.array([r.fraction for r in results], np.float32)
  scores = passed if mode == "all" else fraction
  n = max(len(results), 1)
  metrics = {"pass_rate": float(passed.mean()) if results else 0.0,
             "fraction": float(fraction.mean()) if results else 0.0}
  for status in sandbox.STATUSES:
    metrics[f"status/{status}"] = sum(r.status == status for r in results) / n
  details = [{"status": r.status, "tests_passed": r.tests_passed, "tests_run": r.tests_run,
              "tests_total": r.tests_total, "complete": r.complete, "error": r.error}
             for r in results]
  return RewardOutput(scores, metrics, details)


def _defines(module: ast.Module, name: str) -> bool:
  for stmt in module.body:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      if stmt.name == name:
        return True
    elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
      targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
      if any(isinstance(t, ast.Name) and t.id == name for t in targets):
        return True
    elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
      if any((a.asname or a.name.split(".")[0]) == name for a in stmt.names):
        return True
  return False


def format_checks(task: Task, completion: str, *,
                  stop_sequences: Sequence[str] = HUMANEVAL_STOP) -> dict[str, bool]:
  """Each check of FORMAT_CHECKS for one completion, True when it holds.

  parses: the assembled program parses (ast.parse; at most 1 MiB of source).
  non_empty: the completion's code (after truncation or fence extraction) has
    a non-blank character.
  entry_point: the program defines the task's entry point at top level (def,
    class, assignment or import); holds for tasks without an entry point.
  no_stray_text: only whitespace was removed from the completion: nothing after
    the first stop sequence (prompt+completion), nothing outside the chosen
    fenced block (completion style).
  """
  program, code, stray = _parts(task, completion, stop_sequences)
  module = _parse(program)
  return {
      "parses": module is not None,
      "non_empty": bool(code.strip()),
      "entry_point": (not task.entry_point
                      or (module is not None and _defines(module, task.entry_point))),
      "no_stray_text": not stray.strip(),
  }


@register("format")
def format_reward(tasks: Sequence[Task], completions: Sequence[str], *,
                  checks: Sequence[str] = FORMAT_CHECKS,
                  stop_sequences: Sequence[str] = HUMANEVAL_STOP) -> RewardOutput:
  """1.0 for a completion passing every selected check of `format_checks`, else 0.0.

  Used as a penalty by its weight: within a GRPO group only differences
  matter, so a score of 1 for well-formed completions is the same signal as -1
  for malformed ones. Runs no code.

  Args:
    tasks, completions: as for every reward.
    checks: a subset of FORMAT_CHECKS.
    stop_sequences: where prompt+completion completions are cut.

  Returns:
    scores in {0, 1}; metrics fail/<check> (share failing each selected check).
  """
  unknown = sorted(set(checks) - set(FORMAT_CHECKS))
  if unknown or not checks:
    raise ValueError(f"checks must be a non-empty subset of {FORMAT_CHECKS}, got {list(checks)}")
  if len(tasks) != len(completions):
    raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
  stops = tuple(stop_sequences)
  results = [format_checks(t, c, stop_sequences=stops) for t, c in zip(tasks, completions)]
  scores = np.array([all(r[c] for c in checks) for r in results], np.float32)
  n = max(len(results), 1)
  metrics = {f"fail/{c}": sum(not r[c] for r in results) / n for c in checks}
  details = [{c: r[c] for c in checks} for r in results]
  return RewardOutput(scores, metrics, details)
