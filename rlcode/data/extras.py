"""What each kind of task carries beyond its prompt, reference and tests: typed extras.

A `Task`'s `extra` is one of these, chosen by its kind ("code", "diff", "section", "swe",
"verifiers", "gym"), so every field a reward, a tool or a builder reads is declared here with its
default and its meaning. Data sets give them as mappings (a JSON-lines row's "extra" object, a
builder's dict): `extra_for(kind, mapping)` checks the keys (an unknown one is an error
naming it) and fills the defaults. Stored with a task, an extra is its non-default
fields as JSON, so adding a field changes no stored task.

A data set's own description of a task (what only its own code reads, such as the
scripted demonstrator of the tool tasks, rlcode.agent.expert) travels in `hint`, which
generic code never opens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlcode.errors import BadInput

ASSEMBLE = ("prompt+completion", "completion", "files", "chat")


@dataclasses.dataclass(frozen=True)
class CodeExtra:
  """A program checked by tests (kind "code").

  Attributes:
    assemble: how a completion becomes the program the tests run: "prompt+completion"
      (HumanEval's: the prompt is the function's head), "completion" (a whole program),
      "files" (an edit of `files`, rlcode.rewards.tests) or "chat" (a chat model's answer
      to `code_prompt` asked through its template: its first python block is the whole
      function, run after code_prompt's imports; rlcode.data.chat_prompts).
    tests_format: how the tests are written: "auto" (detected), "script" or "check"
      (rlcode.sandbox.testplan).
    family: the problem's family (problems of one family share a split).
    files: a workspace's files (a tool-use episode's, rlcode.agent.env).
    solution: the file of the workspace whose content the tests score.
    tests_visible: weaker tests the policy may run (run_tests); the reward runs the
      task's own.
    support_files: source files the tests import and the answer does not edit.
    hint: the data set's own description of the task, read only by that data set's code.
    code_prompt: a "chat" task's function head as plain code (its prompt is the rendered
      conversation).
    rendered: the prompt is a conversation rendered by a chat template, special tokens
      written as text: it is encoded without the tokenizer adding its own.
  """

  assemble: str = "prompt+completion"
  tests_format: str = "auto"
  family: str = ""
  files: Mapping[str, str] = dataclasses.field(default_factory=dict)
  solution: str = "solution.py"
  tests_visible: str = ""
  support_files: Mapping[str, str] = dataclasses.field(default_factory=dict)
  hint: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  code_prompt: str = ""
  rendered: bool = False


@dataclasses.dataclass(frozen=True)
class DiffExtra:
  """A change to files, scored against the real one (kind "diff", rlcode.data.edits).

  Attributes:
    files: the files before the change (those the prompt shows, whole or excerpted).
    oracle: the files after the real change (only those it touches).
    edit_format: the answer format: "search_replace", "unified_diff" or "line_edit".
    new_files: paths the change adds.
    commit: the commit of the change.
    pr: the PR (first-parent commit) it belongs to.
    time: the PR's commit time (Unix seconds).
    unit: its granularity: "pr", "commit", "file" or "hunk".
    open_file: line_edit: the file a block without a path edits ("" when several show).
    shown_lines: line_edit with shown numbers: each file's numbers of its shown lines.
    tests_visible: weaker tests of the change (a reward may score by them).
    tests_format: how the task's tests are written (rlcode.sandbox.testplan).
    support_files: source files the tests import and the answer does not edit.
    assemble: "files" when the task has tests (the tests reward applies the edit to
      `files` and runs them).
  """

  files: Mapping[str, str] = dataclasses.field(default_factory=dict)
  oracle: Mapping[str, str] = dataclasses.field(default_factory=dict)
  edit_format: str = "search_replace"
  new_files: tuple[str, ...] = ()
  commit: str = ""
  pr: str = ""
  time: int = 0
  unit: str = ""
  open_file: str = ""
  shown_lines: Mapping[str, list[int]] | None = None
  tests_visible: str = ""
  tests_format: str = "auto"
  support_files: Mapping[str, str] = dataclasses.field(default_factory=dict)
  assemble: str = "prompt+completion"


@dataclasses.dataclass(frozen=True)
class SectionExtra:
  """The next section of a document (kind "section", rlcode.data.sections).

  Attributes:
    document: the document's id.
    section: the section's index in it.
    heading: the section's title.
    format: the document's format ("markdown", "rst", "python", "text").
    context_truncated: the preceding sections were cut from the front to fit the budget.
  """

  document: str = ""
  section: int = 0
  heading: str = ""
  format: str = ""
  context_truncated: bool = False


@dataclasses.dataclass(frozen=True)
class SweExtra:
  """A change to a real repository, checked by the repository's own tests (kind "swe",
  rlcode.swe; SWE-bench's fields). The workspace is the repository at `base_commit`, read
  from `repo` when needed, never stored with the task.

  Attributes:
    repo: the history (a repository or git bundle; a relative path is tried against the
      working directory, then the project root).
    repo_name: the repository's name (SWE-bench's `repo`).
    base_commit: the commit the change applies to (the PR's first parent).
    commit: the PR's commit.
    patch: the gold code patch (a git diff; SWE-bench's `patch`).
    test_patch: the PR's changes to its tests (withheld from the workspace, applied
      before the tests run).
    fail_to_pass: pytest node ids that fail before the change and pass after it.
    pass_to_pass: node ids that pass before and after.
    test_files: the test files the tests run (with the test patch applied).
    test_deps: distributions the tests need besides pytest (rlcode.swe.testenv).
    python_path: workspace directories on sys.path ("src" of a src layout, ".").
    hypothesis_examples: examples per hypothesis test (0: the tests' own).
    timeout: wall clock of one test run, seconds.
    time: the PR's commit time (Unix seconds).
    edit_format: the answer format (rlcode.data.edits) a completion is written in.
    gold_runs: how many runs of the gold patch passed every FAIL_TO_PASS test when it was
      mined, each with its own hash seed (rlcode.swe.validate); 0: not mined here.
  """

  repo: str = ""
  repo_name: str = ""
  base_commit: str = ""
  commit: str = ""
  patch: str = ""
  test_patch: str = ""
  fail_to_pass: tuple[str, ...] = ()
  pass_to_pass: tuple[str, ...] = ()
  test_files: tuple[str, ...] = ()
  test_deps: tuple[str, ...] = ()
  python_path: tuple[str, ...] = (".",)
  hypothesis_examples: int = 0
  timeout: float = 120.0
  time: int = 0
  edit_format: str = "unified_diff"
  gold_runs: int = 0


@dataclasses.dataclass(frozen=True)
class VerifiersExtra:
  """A row of a `verifiers` environment's dataset (kind "verifiers",
  rlcode.harness.verifiers_env): the environment's own rollout plays it and its rubric
  scores it.

  Attributes:
    env: the environment's id ("" for one made of local rows).
    row: the row as the environment's rollout takes it (prompt, answer, info, example_id).
  """

  env: str = ""
  row: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class GymExtra:
  """A question with a checkable answer from a reasoning-gym generator (kind "gym",
  rlcode.data.reasoning_gym), scored by that generator's own score_answer (the "gym"
  reward, rlcode.rewards.gym). `config`, `answer` and `metadata` hold tagged JSON
  (rlcode.data.reasoning_gym.to_json), which gives back tuples and mappings with keys
  other than strings as the generator made them.

  Attributes:
    dataset: the generator's reasoning-gym name.
    config: the keywords its dataset was made with (seed and size included); the reward
      makes it again from them, as some generators' score_answer read their config.
    index: the entry's index in that dataset.
    question: the entry's question (no two tasks of a build share one).
    answer: the entry's answer (None: the generator checks an answer by its metadata).
    metadata: the entry's metadata.
    rendered: the prompt is a conversation rendered by a chat template, special tokens
      written as text (rlcode.data.chat_prompts).
  """

  dataset: str = ""
  config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  index: int = 0
  question: str = ""
  answer: Any = None
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  rendered: bool = False


EXTRAS: dict[str, type] = {"code": CodeExtra, "diff": DiffExtra, "section": SectionExtra,
                           "swe": SweExtra, "verifiers": VerifiersExtra, "gym": GymExtra}
Extra = CodeExtra | DiffExtra | SectionExtra | SweExtra | VerifiersExtra | GymExtra


def extra_for(kind: str, value: Mapping | Extra | None, where: str = "task") -> Extra:
  """The typed extra of a `kind` task from a mapping (or an extra, returned as it is)."""
  if kind not in EXTRAS:
    raise BadInput(f"{where}: kind {kind!r}; known kinds: {sorted(EXTRAS)}")
  cls = EXTRAS[kind]
  if isinstance(value, cls):
    return value
  if dataclasses.is_dataclass(value):
    raise BadInput(f"{where}: a {kind!r} task's extra is a {cls.__name__}, not a "
                   f"{type(value).__name__}")
  value = dict(value or {})
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(value) - names)
  if unknown:
    raise BadInput(f"{where}: extra has no field {unknown[0]!r} for a {kind!r} task; "
                   f"fields: {sorted(names)}")
  for f in dataclasses.fields(cls):  # JSON gives lists where the field holds a tuple
    if isinstance(f.default, tuple) and isinstance(value.get(f.name), list):
      value[f.name] = tuple(value[f.name])
  return cls(**value)


def extra_dict(extra: Extra) -> dict[str, Any]:
  """The fields of an extra that differ from their defaults (how a task stores it)."""
  out = {}
  for f in dataclasses.fields(extra):
    value = getattr(extra, f.name)
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if value != default:
      out[f.name] = list(value) if isinstance(value, tuple) else value
  return out
