"""The tools of an episode, each a small class with a JSON schema.

A tool reads its arguments (already checked against `parameters` by
rlcode.agent.calls) and an episode `Context`, acts on the episode's workspace,
which lives in one sandbox session (rlcode.sandbox.session), and returns a
`ToolResult`: the observation text, whether the episode is done, and facts for
the logs and the memory rules. Workspace paths are relative to the workspace root;
the session refuses the rest. A tool never raises on a bad request from the
policy: a missing file, an ambiguous replacement or a failing command is an
observation.

A tool bounds what it returns before the text leaves it, and says what it cut: a view
shows at most MAX_LINES lines, a listing MAX_LINES paths, a line (of a view, a search hit,
a passage, a lint message) at most MAX_LINE_CHARS characters, a test report
MAX_REPORT_CHARS, bash the session's `max_output_bytes`; a memory note over
rlcode.agent.memory.MAX_NOTE_CHARS is refused. The sampler's observation budget cuts again
on tokens, but only after the text has been decoded, logged and held: a file of a million
empty lines would otherwise be an observation of 7.9 million characters.

Tools: bash, editor (view, create, str_replace, insert), search (text, or
semantic with the MiniLM encoder), run_tests, lint (ruff's error rules over the files
the workspace says changed: rlcode.agent.lint), think (no effect), memory (store,
retrieve; persists across the episodes of a run), finish. What the answer, the tests and
the linted files are is the task's workspace's (rlcode.agent.workspace).

This module must not know about tokens, sampling or training.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from rlcode.agent import lint
from rlcode.agent.memory import MAX_NOTE_CHARS
from rlcode.agent.workspace import workspace_for
from rlcode.data.tasks import Task
from rlcode.errors import UnknownKey
from rlcode.sandbox.session import Session, SessionError


@dataclasses.dataclass
class ToolResult:
  text: str
  done: bool = False
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Context:
  """What a tool may use during one episode.

  Attributes:
    session: the episode's workspace.
    task: the task.
    run_tests: (task, answer) -> rlcode.sandbox.Result of the task's visible tests.
    memory: the run's memory (rlcode.agent.memory.Memory), or None.
    embed: texts -> L2-normalised embeddings [N, D] (semantic search), or None.
    bash_seconds: wall clock of one bash command.
    workspace: the task's workspace (rlcode.agent.workspace); None: its kind's.
  """

  session: Session
  task: Task
  run_tests: Callable[[Task, str], Any]
  memory: Any = None
  embed: Callable[[Sequence[str]], np.ndarray] | None = None
  bash_seconds: float = 5.0
  workspace: Any = None

  def __post_init__(self):
    if self.workspace is None:
      self.workspace = workspace_for(self.task)


class Tool:
  """A tool: `name`, `description`, `parameters` (a JSON schema of its arguments)."""

  name: ClassVar[str]
  description: ClassVar[str]
  parameters: ClassVar[dict[str, Any]]

  def schema(self) -> dict[str, Any]:
    """The OpenAI/Hermes function schema."""
    return {"type": "function", "function": {
        "name": self.name, "description": self.description, "parameters": self.parameters}}

  def __call__(self, ctx: Context, args: dict[str, Any]) -> ToolResult:
    raise NotImplementedError


def _object(required: Sequence[str] = (), **properties) -> dict[str, Any]:
  return {"type": "object", "properties": properties, "required": list(required),
          "additionalProperties": False}


_STR = {"type": "string"}

MAX_LINES = 200
MAX_LINE_CHARS = 300
MAX_REPORT_CHARS = 2000


def clip(text: str, limit: int = MAX_LINE_CHARS, at: int = 0) -> str:
  """At most `limit` characters of `text`, from a little before `at` (a match to keep in
  view), each cut side marked with how many characters it dropped."""
  if len(text) <= limit:
    return text
  start = max(0, min(at - limit // 4, len(text) - limit))
  head = f"[... {start:,} characters] " if start else ""
  rest = len(text) - start - limit
  return head + text[start:start + limit] + (f" [... {rest:,} more characters]" if rest else "")


def _error(message: Any) -> ToolResult:
  """An error observation; its message may echo what the policy sent (a path), so it is
  clipped like a line."""
  return ToolResult(f"error: {clip(str(message))}", info={"error": True})


class Bash(Tool):
  name = "bash"
  description = ("Run a bash command in the workspace (time and output limited; "
                 "no network; background processes end with the command).")
  parameters = _object(["command"], command=_STR)

  def __call__(self, ctx, args):
    r = ctx.session.exec(args["command"], timeout=ctx.bash_seconds)
    notes = []
    if r.timed_out:
      notes.append(f"[killed after {ctx.bash_seconds:g} s]")
    if r.truncated:
      notes.append(f"[output truncated: the first {ctx.session.limits.max_output_bytes:,} "
                   "bytes are shown]")
    if r.exit_code not in (0, None):
      notes.append(f"[exit code {r.exit_code}]")
    text = r.output + ("\n" if r.output and notes and not r.output.endswith("\n") else "")
    return ToolResult(text + " ".join(notes),
                      info={"exit_code": r.exit_code, "timed_out": r.timed_out})


class Editor(Tool):
  name = "editor"
  description = ("View a file (numbered lines) or the workspace's files, create or overwrite "
                 "a file, replace a unique string in a file, or insert text after a line.")
  parameters = _object(
      ["command", "path"],
      command={"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
      path=_STR, file_text=_STR, old_str=_STR, new_str=_STR,
      insert_line={"type": "integer"},
      view_range={"type": "array", "items": {"type": "integer"}})

  def __call__(self, ctx, args):
    command, path = args["command"], args["path"]
    need = {"create": ["file_text"], "str_replace": ["old_str"],
            "insert": ["insert_line", "new_str"]}.get(command, [])
    missing = [k for k in need if k not in args]
    if missing:
      return _error(f"editor {command} needs {missing}")
    try:
      return getattr(self, "_" + command)(ctx.session, path, args)
    except SessionError as e:
      return _error(e)

  def _view(self, session, path, args):
    if path in ("", ".", "/"):
      paths = session.files()
      more = len(paths) - MAX_LINES
      shown = "\n".join(clip(p) for p in paths[:MAX_LINES]) or "(no files)"
      return ToolResult(shown + (f"\n[... {more:,} more files not shown]" if more > 0 else ""))
    lines = session.read(path).splitlines()
    start, end = 1, len(lines)
    if "view_range" in args:
      r = args["view_range"]
      if len(r) != 2 or not 1 <= r[0] <= max(r[1], 1) or r[1] > len(lines):
        return _error(f"view_range must be [start, end] within 1..{len(lines)}")
      start, end = r
    last = min(end, start + MAX_LINES - 1)
    text = "\n".join(f"{i:4d} {clip(lines[i - 1])}" for i in range(start, last + 1))
    if last < end:
      text += (f"\n[... {end - last:,} more lines not shown; view a range with "
               f"view_range=[{last + 1}, {min(end, last + MAX_LINES)}]]")
    return ToolResult(text)

  def _create(self, session, path, args):
    text = args["file_text"]
    session.write(path, text)
    return ToolResult(f"Wrote {clip(path)} ({len(text.splitlines())} lines).",
                      info={"wrote": path})

  def _str_replace(self, session, path, args):
    text = session.read(path)
    old, new = args["old_str"], args.get("new_str", "")
    count = text.count(old) if old else 0
    if count != 1:
      return _error(f"old_str occurs {count} times in {path}; it must occur once")
    session.write(path, text.replace(old, new, 1))
    return ToolResult(f"Replaced in {clip(path)}.", info={"wrote": path})

  def _insert(self, session, path, args):
    lines = session.read(path).splitlines(keepends=True)
    at = args["insert_line"]
    if not 0 <= at <= len(lines):
      return _error(f"insert_line must be in 0..{len(lines)}")
    new = args["new_str"] if args["new_str"].endswith("\n") else args["new_str"] + "\n"
    if at and not lines[at - 1].endswith("\n"):
      lines[at - 1] += "\n"
    session.write(path, "".join(lines[:at]) + new + "".join(lines[at:]))
    return ToolResult(f"Inserted after line {at} of {clip(path)}.", info={"wrote": path})


class Search(Tool):
  name = "search"
  description = ("Search the workspace's files: mode text finds lines containing the query; "
                 "mode semantic ranks passages by meaning (MiniLM sentence embeddings).")
  parameters = _object(["query"], query=_STR,
                       mode={"type": "string", "enum": ["text", "semantic"]})
  MAX_HITS = 20
  PASSAGE_LINES = 8
  TOP_PASSAGES = 3
  MAX_FILES = 200

  def __call__(self, ctx, args):
    query, mode = args["query"], args.get("mode", "text")
    if not query.strip():
      return _error("empty query")
    try:
      paths = ctx.session.files()[:self.MAX_FILES]
    except SessionError as e:
      return _error(e)
    files, unread = {}, 0
    for p in paths:  # a file too large (or named in no text) is skipped, not fatal
      try:
        files[p] = ctx.session.read(p)
      except SessionError:
        unread += 1
    skipped = f"\n[{unread} files not searched: unreadable or too large]" if unread else ""
    if mode == "text":
      hits = [(p, i, line) for p, text in files.items()
              for i, line in enumerate(text.splitlines(), 1) if query in line]
      more = len(hits) - self.MAX_HITS
      text = "\n".join(f"{clip(p)}:{i}: {clip(line, at=line.index(query))}"
                       for p, i, line in hits[:self.MAX_HITS]) or "no matches"
      return ToolResult(text + (f"\n[{more} more matches]" if more > 0 else "") + skipped,
                        info={"hits": len(hits)})
    if ctx.embed is None:
      return _error("semantic search is not available in this run")
    passages = []
    for p, text in files.items():
      lines = text.splitlines()
      for s in range(0, max(len(lines), 1), self.PASSAGE_LINES):
        chunk = "\n".join(lines[s:s + self.PASSAGE_LINES])
        if chunk.strip():
          passages.append((p, s + 1, min(s + self.PASSAGE_LINES, len(lines)), chunk))
    if not passages:
      return ToolResult("no passages", info={"hits": 0})
    vecs = ctx.embed([query] + [c for *_, c in passages])
    scores = vecs[1:] @ vecs[0]
    best = np.argsort(-scores, kind="stable")[:self.TOP_PASSAGES]
    out = [f"{clip(passages[i][0])}:{passages[i][1]}-{passages[i][2]} (score {scores[i]:.2f})\n"
           + "\n".join(clip(line) for line in passages[i][3].split("\n")) for i in best]
    return ToolResult("\n".join(out), info={"hits": len(best)})


class RunTests(Tool):
  name = "run_tests"
  description = "Run the task's visible tests against the workspace; reports the first failure."
  parameters = _object()

  def __call__(self, ctx, args):
    try:
      program = ctx.workspace.answer(ctx.session, ctx.task)
    except SessionError as e:
      return ToolResult(f"error: {clip(str(e))}", info={"tests_passed": False, "error": True})
    r = ctx.run_tests(ctx.task, program)
    if r.passed:
      text = f"passed {r.tests_passed}/{r.tests_total} tests"
    elif r.status == "failed":
      text = f"failed: {r.tests_passed}/{r.tests_total} passed; {clip(r.error, MAX_REPORT_CHARS)}"
    else:
      text = f"{r.status}: {clip(r.error, MAX_REPORT_CHARS)}"
    return ToolResult(text, info={"tests_passed": bool(r.passed), "fraction": r.fraction,
                                  "report": text, "program": program})


class Lint(Tool):
  name = "lint"
  description = ("Lint the Python files you changed (or the file `path`) with ruff's error "
                 "rules: syntax errors, undefined names, unused imports.")
  parameters = _object(path=_STR)
  MAX_MESSAGES = 30

  def __call__(self, ctx, args):
    try:
      if "path" in args:
        files = {args["path"]: ctx.session.read(args["path"])}
      else:
        files = ctx.workspace.lint_files(ctx.session, ctx.task)
    except SessionError as e:
      return _error(e)
    files = {p: t for p, t in files.items() if p.endswith((".py", ".pyi"))}
    if not files:
      return ToolResult("no Python file to lint", info={"lint_messages": 0})
    try:
      messages = lint.check(files)
    except lint.LintUnavailable as e:
      return _error(e)
    more = len(messages) - self.MAX_MESSAGES
    text = "\n".join(clip(m) for m in messages[:self.MAX_MESSAGES]) or f"no problems in {len(files)} files"
    return ToolResult(text + (f"\n[{more} more messages]" if more > 0 else ""),
                      info={"lint_messages": len(messages)})


class Think(Tool):
  name = "think"
  description = "Write down a thought. It changes nothing and returns nothing."
  parameters = _object(["thought"], thought=_STR)

  def __call__(self, ctx, args):
    return ToolResult("")


class MemoryTool(Tool):
  name = "memory"
  description = ("Store a note for later episodes of this run, or retrieve the notes "
                 "closest to a query.")
  parameters = _object(["action", "text"],
                       action={"type": "string", "enum": ["store", "retrieve"]}, text=_STR)
  TOP = 3

  def __call__(self, ctx, args):
    if ctx.memory is None:
      return _error("memory is not available in this run")
    text = args["text"]
    if args["action"] == "store":
      # Refused rather than cut: a note cut short can say the opposite of what was meant,
      # and the policy can store a shorter one.
      if len(text) > MAX_NOTE_CHARS:
        return _error(f"a note holds at most {MAX_NOTE_CHARS:,} characters; this one has "
                      f"{len(text):,}, and was not stored")
      ctx.memory.propose(text)
      return ToolResult("Noted.", info={"stored": text})
    found = ctx.memory.retrieve(text, self.TOP)
    # error_fix notes carry a whole program, which no store limit bounded.
    return ToolResult("\n".join(f"- {clip(e, MAX_NOTE_CHARS)}" for e in found) or "no notes",
                      info={"retrieved": list(found)})


class Finish(Tool):
  name = "finish"
  description = "End the episode; the solution file is then tested."
  parameters = _object()

  def __call__(self, ctx, args):
    return ToolResult("", done=True)


TOOLS: dict[str, type[Tool]] = {t.name: t for t in (
    Bash, Editor, Search, RunTests, Lint, Think, MemoryTool, Finish)}


def make_tools(names: Sequence[str]) -> list[Tool]:
  """Instances of the named tools, in order; `finish` must be among them."""
  unknown = [n for n in names if n not in TOOLS]
  if unknown:
    raise UnknownKey(f"agent.tools: unknown {unknown}; known: {sorted(TOOLS)}")
  if "finish" not in names:
    raise UnknownKey(f"agent.tools={list(names)} must include 'finish'")
  return [TOOLS[n]() for n in names]
