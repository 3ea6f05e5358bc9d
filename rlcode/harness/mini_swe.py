"""mini-swe-agent (SWE-agent's bash-only agent, the PyPI package, unmodified) as a harness on
rlcode's executable PR tasks (harness.mini_swe_agent; configs/harness_mini_swe.py).

An episode is mini-swe-agent's own `DefaultAgent.run` on the task's statement, with its own
`LitellmTextbasedModel` pointed at rlcode's endpoint (litellm's "openai/<model>" provider:
POST /v1/chat/completions with the X-Episode-Id header, at rl.temperature, log-probs
asked) and its prompts, templates and limits from one of its own configs (default: its
SWE-bench config with bash blocks, `swebench_backticks`). The only piece rlcode supplies is
the environment: `SandboxEnvironment` runs each of the agent's commands in the task's
workspace inside rlcode's sandbox (rlcode.sandbox.session: one session an episode, the
repository at the PR's base commit, its test environment mounted, as the built-in agent's
episodes have, rlcode.swe.workspace), and knows the agent's submit line
(COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT) as its LocalEnvironment does.

The reward is the task's tests on the workspace the agent left (rlcode's "swe_tests"
reward of the workspace's diff against the base: every FAIL_TO_PASS and PASS_TO_PASS
test passes), whatever the agent submitted. An episode ends at the agent's submit, its
step limit, its repeated format errors, or when the conversation outgrows the policy's
context (rlcode's 400 of code context_length_exceeded, which litellm raises as
ContextWindowExceededError): all of these are the policy's outcomes and keep the tests'
score. Anything else the agent raises (a server error, a dead session) fails the episode.

Process-wide settings, made when this module is imported unless already set: litellm
reads its bundled model price map (LITELLM_LOCAL_MODEL_COST_MAP; no network), mini-swe-
agent starts silently and does not retry a failed call (MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT
1: the server is in this process; a retry would only hide its error behind minutes of
back-off); litellm's banner on errors is suppressed.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import shlex
from typing import Any

from rlcode.agent.env import Scorer
from rlcode.agent.workspace import workspace_for
from rlcode.data.tasks import Task
from rlcode.errors import BadInput
from rlcode.harness.recorder import HEADER
from rlcode.sandbox.session import Session, SessionLimits
from rlcode.swe import tasks

for _name, _value in (("LITELLM_LOCAL_MODEL_COST_MAP", "True"), ("MSWEA_SILENT_STARTUP", "1"),
                      ("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")):
  os.environ.setdefault(_name, _value)

import litellm  # noqa: E402 (after the settings)
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import get_config_path  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel  # noqa: E402

litellm.suppress_debug_info = True  # its "Provider List" banner on every error

# The submit line's output ends the episode; these statuses are the agent's own endings.
ENDINGS = ("Submitted", "LimitsExceeded", "RepeatedFormatError", "context_length_exceeded")


def load_config(name: str) -> dict:
  """A mini-swe-agent config (its own by name, e.g. "swebench_backticks", or a YAML path):
  its "agent" and "model" sections; one line when it cannot be read."""
  import yaml
  try:
    path = get_config_path(name)
  except FileNotFoundError:
    raise BadInput(f"config.harness.mini_swe_agent.config={name!r}: neither a file nor one "
                   "of mini-swe-agent's configs (e.g. 'swebench_backticks')") from None
  try:
    data = yaml.safe_load(path.read_text())
  except (OSError, yaml.YAMLError) as e:
    raise BadInput(f"config.harness.mini_swe_agent.config={name!r}: {e}") from None
  if not isinstance(data, dict) or not isinstance(data.get("agent"), dict):
    raise BadInput(f"config.harness.mini_swe_agent.config={name!r}: not a mini-swe-agent "
                   "config (a mapping with an 'agent' section)")
  return {"agent": dict(data["agent"]), "model": dict(data.get("model") or {})}


class SandboxEnvironment(LocalEnvironment):
  """mini-swe-agent's environment protocol over an rlcode sandbox session: `execute` runs
  the command with bash in the session's workspace (one command a call, its own subshell,
  killed after `timeout` seconds); the submit line is LocalEnvironment's own check. The
  agent's template variables are this environment's settings only: the host's environment
  variables (LocalEnvironment's) never reach a prompt."""

  def __init__(self, session: Session, *, timeout: int):
    super().__init__(timeout=timeout)
    self.session = session

  def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
    r = self.session.exec(str(action.get("command", "")), timeout=timeout or self.config.timeout)
    info = (f"the command was killed after {timeout or self.config.timeout} s" if r.timed_out
            else "")
    output = {"output": r.output, "returncode": r.exit_code, "exception_info": info}
    self._check_finished(output)
    return output

  def get_template_vars(self, **kwargs) -> dict[str, Any]:
    return {**self.config.model_dump(), "system": "Linux", **kwargs}


@dataclasses.dataclass
class Harness:
  """harness(task, base_url, api_key, episode_id): one mini-swe-agent episode on an
  executable PR task (module docstring); returns {"reward", "exit_status", "calls",
  "messages" (the agent's trajectory, its own format), "details" (the tests' report)}.

  Args:
    model: the served model's name.
    config: a mini-swe-agent config by name or path (`load_config`).
    temperature: the sampling temperature (rl.temperature).
    max_tokens: each call's max_tokens; None: the server's default.
    step_limit: model calls an episode allows (the config's step_limit is replaced).
    command_seconds: wall clock of one command in the sandbox (and its CPU seconds).
  """

  model: str
  config: str = "swebench_backticks"
  temperature: float = 1.0
  max_tokens: int | None = None
  step_limit: int = 20
  command_seconds: int = 60

  def __post_init__(self):
    self.settings = load_config(self.config)
    self.scorer = Scorer({"swe_tests": 1.0})
    self.limits = SessionLimits(command_seconds=float(self.command_seconds),
                                cpu_seconds=int(self.command_seconds))

  def agent(self, model, env) -> DefaultAgent:
    """The config's agent on `model` and `env`, at this harness's step limit, no cost
    limit (the policy's calls cost nothing)."""
    return DefaultAgent(model, env, **{**self.settings["agent"], "step_limit": self.step_limit,
                                       "cost_limit": 0.0, "output_path": None})

  def model_for(self, base_url: str, api_key: str, episode_id: str) -> LitellmTextbasedModel:
    """The config's model settings on rlcode's endpoint, the episode named in a header."""
    settings = {k: v for k, v in self.settings["model"].items()
                if k not in ("model_name", "model_kwargs", "model_class")}
    kwargs = {"api_base": base_url, "api_key": api_key, "extra_headers": {HEADER: episode_id},
              "temperature": self.temperature, "logprobs": True,
              **({"max_tokens": self.max_tokens} if self.max_tokens is not None else {})}
    return LitellmTextbasedModel(model_name=f"openai/{self.model}", model_kwargs=kwargs,
                                 cost_tracking="ignore_errors", **settings)

  def __call__(self, task: Task, base_url: str, api_key: str, episode_id: str) -> dict:
    return self.play(task, self.model_for(base_url, api_key, episode_id))

  def play(self, task: Task, model) -> dict:
    """One episode of `task` with `model` (any mini-swe-agent model: the policy's, or a
    scripted one)."""
    if task.kind != "swe":
      raise BadInput(f"task {task.id!r}: mini-swe-agent works on executable PR tasks "
                     f"(kind 'swe'), not {task.kind!r}")
    workspace = workspace_for(task)
    with Session(self.limits, **workspace.session_options(task)) as session:
      for path, text in workspace.files(task).items():
        session.write(path, text)
      agent = self.agent(model, SandboxEnvironment(session, timeout=self.command_seconds))
      try:
        status = agent.run(task=workspace.statement(task)).get("exit_status", "")
      except litellm.exceptions.ContextWindowExceededError:
        status = "context_length_exceeded"
      if status not in ENDINGS:
        raise RuntimeError(f"mini-swe-agent stopped on {status or 'an error'}: "
                           f"{agent.messages[-1].get('content', '')[:300]}")
      answer = workspace.answer(session, task)
    reward, details = self.scorer.reward(task, answer)
    return {"reward": reward, "exit_status": status, "calls": agent.n_calls,
            "messages": agent.messages, "details": details}


def gold_commands(task: Task) -> list[str]:
  """Bash commands that write the gold patch's files into the workspace (each file's text
  base64-encoded through python3, so any byte survives the shell), then submit."""
  base = tasks.base_files(task)
  commands = []
  for path, text in sorted(tasks.gold_changes(task, base).items()):
    data = base64.b64encode((text or "").encode()).decode()
    script = (f"import base64, pathlib; p = pathlib.Path({path!r}); "
              "p.parent.mkdir(parents=True, exist_ok=True); "
              f"p.write_bytes(base64.b64decode({data!r}))")
    commands.append(f"python3 -c {shlex.quote(script)}")
  return commands + ["echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]


def gold_model(task: Task):
  """mini-swe-agent's own scripted model (DeterministicModel) whose actions are
  `gold_commands`."""
  from minisweagent.models.test_models import DeterministicModel, make_output
  return DeterministicModel(outputs=[make_output("THOUGHT: the gold patch.", [{"command": c}],
                                                 cost=0.0)
                                     for c in gold_commands(task)])
