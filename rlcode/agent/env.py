"""The tool-use environment: `reset(task) -> observation`, `step(turn) -> observation,
reward, done`.

An episode's state is a working copy of the task's files in one sandbox session
(rlcode.sandbox.session) that lives from `reset` to the end of the episode, so files
written in turn 3 are there in turn 7. What the files are, what the episode's answer is
and how its visible tests run are the task's workspace's (rlcode.agent.workspace, by
the task's kind: a few files and a solution file, or a real repository). Each step parses the
policy's turn (rlcode.agent.calls), runs the named tool in that session, and
returns its text; a malformed call, an unknown tool or wrong arguments is an error
observation. The episode ends at `finish`, at a turn that is a final answer (ended
by end-of-sequence), at `max_turns`, when its tools have spent `episode_seconds`
of wall clock (the policy's own sampling time does not count), when its session dies, or when the caller `abort`s
it (a token budget). Its reward is then the configured rewards (rlcode.rewards) of
the workspace's answer (the solution file, or the repository's diff); earlier steps
return reward 0 and per-turn signals in `info`.

This module works on text; tokens, budgets on tokens and batching live in
rlcode.agent.sampler and rlcode.agent.rollout.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlcode import rewards, sandbox
from rlcode.agent import calls
from rlcode.agent.memory import Memory
from rlcode.agent.tools import Context, Tool, ToolResult
from rlcode.agent.workspace import workspace_for
from rlcode.data.tasks import Task
from rlcode.sandbox.session import Session, SessionError, SessionLimits

log = logging.getLogger(__name__)

# How an episode ended. The last three are cut by a budget or a timeout: a config
# may mask such trajectories out of the loss (rlcode.agent.rollout).
STATUSES = ("finished", "answered", "max_turns", "max_tokens", "timeout")
CUT = ("max_turns", "max_tokens", "timeout")


@dataclasses.dataclass
class Step:
  observation: str
  reward: float
  done: bool
  info: dict[str, Any]


class Scorer:
  """Final rewards and test runs, cached by (task id, program): a group's episodes often
  end with the same file, and a run_tests call repeats the visible tests of one."""

  def __init__(self, weights: Mapping[str, float],
               options: Mapping[str, Mapping[str, Any]] | None = None,
               limits: sandbox.Limits | None = None):
    self.weights, self.options = dict(weights), dict(options or {})
    self._box = sandbox.Sandbox(limits, workers=1)
    self._rewards: dict[tuple[str, str], tuple[float, dict]] = {}
    self._tests: dict[tuple[str, str], sandbox.Result] = {}
    self._lock = threading.Lock()

  def reward(self, task: Task, program: str) -> tuple[float, dict]:
    key = (task.id, program)
    with self._lock:
      if key in self._rewards:
        return self._rewards[key]
    out = rewards.compute(self.weights, [task], [program], self.options)
    value = (float(out.scores[0]), out.details[0] if out.details else {})
    with self._lock:
      self._rewards[key] = value
    return value

  def run_tests(self, task: Task, program: str) -> sandbox.Result:
    """The visible tests of the task's workspace on `program` (its answer)."""
    key = (task.id, program)
    with self._lock:
      if key in self._tests:
        return self._tests[key]
    result = workspace_for(task).run_tests(task, program, self._box)
    with self._lock:
      self._tests[key] = result
    return result


class ToolEnv:
  """One episode at a time over `tools`, in a fresh sandbox session per episode.

  Args:
    tools: the tool instances (rlcode.agent.tools.make_tools).
    scorer: final rewards and test runs.
    max_turns: steps before the episode is cut (status max_turns).
    memory: the run's Memory (for the memory tool and its rules), or None.
    embed: texts -> embeddings for semantic search, or None.
    session_limits: limits of the session and its commands.
    bash_seconds: wall clock of one bash command.
    episode_seconds: wall clock the episode's tool calls may spend together (status
      timeout).
    open_session: makes the session from its limits and the workspace's options
      (default: rlcode.sandbox.session.Session).
  """

  def __init__(self, tools: Sequence[Tool], scorer: Scorer, *, max_turns: int,
               memory: Memory | None = None, embed=None,
               session_limits: SessionLimits | None = None, bash_seconds: float = 5.0,
               episode_seconds: float = 120.0,
               open_session: Callable[[SessionLimits | None], Session] | None = None):
    if max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    self.tools = {t.name: t for t in tools}
    self.scorer, self.max_turns, self.memory, self.embed = scorer, max_turns, memory, embed
    self.session_limits, self.bash_seconds = session_limits, bash_seconds
    self.episode_seconds = episode_seconds
    self.open_session = open_session or (lambda limits, **options: Session(limits, **options))
    self.session: Session | None = None
    self.task: Task | None = None
    self.done = True

  def reset(self, task: Task) -> str:
    """Starts an episode of `task`: a fresh session holding its workspace's files. Returns
    the first observation, the task's statement."""
    self.close()
    self.task, self.turns, self.done, self.status = task, 0, False, ""
    self.tool_seconds = 0.0
    self.workspace = workspace_for(task)
    self.session = self.open_session(self.session_limits,
                                     **self.workspace.session_options(task))
    for path, text in self.workspace.files(task).items():
      self.session.write(path, text)
    self.notes = self.memory.episode() if self.memory is not None else None
    self.ctx = Context(session=self.session, task=task, run_tests=self.scorer.run_tests,
                       memory=self.notes, embed=self.embed, bash_seconds=self.bash_seconds,
                       workspace=self.workspace)
    self.failure: str | None = None
    self.fixes: list[tuple[str, str]] = []
    self.final_reward = 0.0
    self.final_program = ""
    return self.workspace.statement(task)

  def step(self, text: str, ended: str) -> Step:
    """One policy turn (its decoded text and how it ended: calls.ENDINGS)."""
    if self.done:
      raise RuntimeError("step() after the episode ended; call reset()")
    self.turns += 1
    info: dict[str, Any] = {"turn": self.turns}
    if ended == "eos":  # the policy ended its message: a final answer, call or not
      return self._end("answered", info)
    try:
      call = calls.parse_turn(text, ended, self.tools)
    except calls.CallError as e:
      call, observation = None, f"error: {e}"
      info["call_error"] = str(e)
    else:
      observation = ""
    if call is not None:
      info["tool"] = call.name
      start = time.monotonic()
      try:
        result = self.tools[call.name](self.ctx, call.arguments)
      except SessionError as e:
        info["session_error"] = str(e)
        return self._end("timeout", info, f"error: {e}")
      except Exception as e:  # noqa: BLE001 (untrusted arguments must not end the run)
        # A tool that fails on what the policy asked is an observation, not a crash; the
        # failure is logged and counted (info["tool_failure"]) so that a bug shows.
        log.warning("tool %s failed on the policy's arguments: %s: %s", call.name,
                    type(e).__name__, e)
        info["tool_failure"] = f"{type(e).__name__}: {e}"[:500]
        result = ToolResult(f"error: the {call.name} tool failed: {type(e).__name__}")
      finally:
        self.tool_seconds += time.monotonic() - start
      observation = result.text
      info.update(result.info)
      self._track_tests(result.info)
      if result.done:
        return self._end("finished", info, observation)
    if self.turns >= self.max_turns:
      return self._end("max_turns", info, observation)
    if self.tool_seconds > self.episode_seconds:
      return self._end("timeout", info, observation)
    return Step(observation, 0.0, False, info)

  def abort(self, status: str) -> float:
    """Ends the episode from outside (a token budget); returns its final reward."""
    if status not in CUT:
      raise ValueError(f"abort status must be one of {CUT}, got {status!r}")
    return self._end(status, {}).reward

  def _track_tests(self, info: dict) -> None:
    """Error-fix pairs for the memory rules: a failing test run, then a passing one."""
    if "tests_passed" not in info or "program" not in info:
      return
    if not info["tests_passed"]:
      self.failure = self.failure or info.get("report", "tests failed")
    elif self.failure is not None:
      self.fixes.append((self.failure, info["program"]))
      self.failure = None

  def _end(self, status: str, info: dict, observation: str = "") -> Step:
    self.done, self.status = True, status
    program = ""
    if self.session is not None and self.session.alive:
      try:
        program = self.workspace.answer(self.session, self.task)
      except SessionError:
        program = ""
    reward, details = self.scorer.reward(self.task, program)
    self.final_reward, self.final_program = reward, program
    if self.notes is not None:
      self.notes.close(reward > 0, self.fixes)
    self.close()
    info.update(status=status, final_reward=reward, reward_details=details)
    return Step(observation, reward, True, info)

  def close(self) -> None:
    if self.session is not None:
      self.session.close()
      self.session = None
