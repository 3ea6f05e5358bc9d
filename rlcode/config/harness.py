"""The config schema's `harness` section: GRPO whose rollouts are an outside harness's
episodes (rlcode.train.harness_loop, trainer "harness"); rlcode.config.schema composes it
into the Config.

An import path names a Python object as "package.module:attribute" (the attribute may be
dotted: "module:Agent.run"). Its form is checked when the config loads; whether it
resolves, and to a callable, when the run starts (one line naming the key, exit 2).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from rlcode.fields import key

_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
IMPORT_PATH = 'an import path "package.module:function"'


def is_import_path(text: str | None) -> bool:
  return text is None or bool(_IMPORT_PATH.fullmatch(text))


@dataclasses.dataclass(frozen=True)
class Verifiers:
  """An environment of the `verifiers` package as the harness and its tasks
  (rlcode.harness.verifiers_env); the job's data.source is then "verifiers".

  Attributes:
    env: an environment id that verifiers' load_environment loads (its package or module
      installed, e.g. "vf-gsm8k"); None: `rows`.
    args: the keyword arguments of that environment's load_environment.
    rows: a JSON-lines file of {"question", "answer"} rows (an optional "info" object),
      made a SingleTurnEnv whose rubric is the exact match of the reply to the answer;
      None: `env`.
    system_prompt: `rows`: the system message before each question; None: none.
    max_tokens: each model call's max_tokens; None: the server's default
      (serve.default_max_tokens, at most what the context leaves).
  """

  env: str | None = key(None)
  args: dict[str, Any] = key({})
  rows: str | None = key(None)
  system_prompt: str | None = key(None)
  max_tokens: int | None = key(None, ge=1)

  def __post_init__(self):
    if (self.env is None) == (self.rows is None):
      raise ValueError("set one of env (an environment's id) and rows (a JSON-lines file "
                       "of question/answer rows)")
    if self.args and self.env is None:
      raise ValueError("args are the arguments of env's load_environment; rows takes none")
    if self.system_prompt is not None and self.rows is None:
      raise ValueError("system_prompt is for rows; an environment by name sets its own")


@dataclasses.dataclass(frozen=True)
class OpenEnv:
  """An OpenEnv environment of the job's code tasks as the harness
  (rlcode.harness.openenv_env): openenv's own server, started on 127.0.0.1 for the run,
  holds a session an episode; an episode resets it to its task and steps it with the
  policy's completions, each scored by the task's tests; its return is the reward. The
  tasks are config.data's, as for `harness`.

  Attributes:
    max_turns: attempts an episode allows (it ends sooner when the tests pass); after a
      failed one the environment says so and asks again, and the next call's prompt is
      the whole episode so far.
    max_tokens: each completion call's max_tokens; None: the server's default
      (serve.default_max_tokens, at most what the context leaves).
  """

  max_turns: int = key(2, ge=1)
  max_tokens: int | None = key(None, ge=1)


@dataclasses.dataclass(frozen=True)
class MiniSweAgent:
  """mini-swe-agent (the PyPI package, unmodified) on the job's executable PR tasks
  (data.source "swe") as the harness (rlcode.harness.mini_swe): its DefaultAgent and
  litellm model, pointed at the policy's endpoint, in rlcode's sandbox; the task's tests
  on the workspace it leaves are the reward.

  Attributes:
    config: one of mini-swe-agent's configs by name (its prompts, templates and output
      format), or a path to a YAML file of the same shape.
    step_limit: model calls an episode allows (replaces the config's).
    max_tokens: each call's max_tokens; None: the server's default
      (serve.default_max_tokens, at most what the context leaves).
    command_seconds: wall clock (and CPU seconds) of one of the agent's commands.
  """

  config: str = key("swebench_backticks")
  step_limit: int = key(20, ge=1)
  max_tokens: int | None = key(None, ge=1)
  command_seconds: int = key(60, ge=1)


@dataclasses.dataclass(frozen=True)
class Harness:
  """An outside harness's episodes as GRPO's rollouts (rlcode.harness.rollouts).

  Attributes:
    harness: the harness: an import path "package.module:function" of a callable
      harness(task, base_url, api_key, episode_id) that works on one task through the
      OpenAI API at base_url (the policy, served in the trainer's process on 127.0.0.1
      under a random key), names each call's episode with the header X-Episode-Id, and
      returns its result (a reward, a mapping with "reward", or what `reward` reads). It
      must sample at rl.temperature, which the update's log-probs assume. None: the
      `verifiers`, `openenv` or `mini_swe_agent` episodes.
    verifiers: a `verifiers` environment whose own rollouts are the episodes (at
      rl.temperature) and whose rubric scores them; its dataset's rows (data.train_split
      "train": its dataset, "eval": its eval dataset) are the tasks. None: another.
    openenv: an OpenEnv environment of config.data's code tasks, served locally, whose
      episodes (completions at rl.temperature, the tests their reward) are the rollouts.
      None: another.
    mini_swe_agent: mini-swe-agent's episodes on config.data's executable PR tasks
      (completions at rl.temperature, the tasks' tests their reward). None: another.
    reward: an import path of reward(task, result) -> float, the environment's score of
      an episode; None: the harness's result carries its reward (a verifiers
      environment's: its rubric's score; an OpenEnv environment's: the episode's return; mini-swe-agent's: the task's tests).
    workers: episodes played at once (threads; an episode given up by the timeout no
      longer holds its place).
    timeout_seconds: an episode running longer is given up and its group dropped; None:
      no limit.
    save_episodes: write each step's episodes (their token-exact segments and what the
      harness returned, e.g. mini-swe-agent's trajectory) to
      workdir/episodes/step_NNNNNN.jsonl.
  """

  harness: str | None = key(None, check=is_import_path, allowed=IMPORT_PATH)
  verifiers: Verifiers | None = key(None)
  openenv: OpenEnv | None = key(None)
  mini_swe_agent: MiniSweAgent | None = key(None)
  reward: str | None = key(None, check=is_import_path, allowed=IMPORT_PATH)
  workers: int = key(8, ge=1)
  timeout_seconds: float | None = key(300.0, gt=0)
  save_episodes: bool = key(False)

  def __post_init__(self):
    if sum(x is not None for x in (self.harness, self.verifiers, self.openenv,
                                   self.mini_swe_agent)) != 1:
      raise ValueError("set one of harness.harness (an import path), harness.verifiers (a "
                       "verifiers environment), harness.openenv (an OpenEnv environment) "
                       "and harness.mini_swe_agent")
