"""Environments of the `verifiers` package (prime-rl's Environments library) as a harness:
their dataset's rows are the tasks, their own rollouts the episodes, their rubrics the
rewards (rlcode.train.harness_loop with config.harness.verifiers and data.source
"verifiers"; configs/harness_verifiers.py).

`load` builds the environment by name (verifiers' own `load_environment`) or from a
JSON-lines file of {"question", "answer"} rows (a SingleTurnEnv scored by `exact_match`;
`rows_env`: any rows and reward functions). `tasks` makes a split of its dataset Tasks of
kind "verifiers" (the row in the extra). `Harness` is the harness callable: an episode is
the environment's `run_rollout` of the row, in an event loop of the episode's thread, on
an AsyncOpenAI client of base_url whose default headers carry X-Episode-Id (in a
vf.OpenAIChatCompletionsClient, which the classic environments take); it returns
verifiers' RolloutOutput, whose "reward" is the rubric's score.

What reaches rlcode's server: POST /v1/chat/completions with the model, the messages
(tools, for tool environments) and the sampling args: the environment's own (n=1 by
default) under temperature (rl.temperature, which the update's log-probs assume) and
max_tokens (sent as max_completion_tokens; None: the environment's, else the server's
default). A field the server cannot honour (vLLM's extra_body fields, penalties) is a
400 naming it, and the episode fails with that line.

An episode fails (rlcode.harness.rollouts counts it and drops its group) when the rollout
raises, or ended on an error of the model's API (verifiers' ModelError: a refused or
failed request) or of the infrastructure (InfraError): verifiers still scores such a
rollout, which would train a reward the policy did not earn. An empty reply
(EmptyModelResponseError) and a conversation past the context (OverlongPromptError: the
rollout ends truncated) are the policy's and keep the rubric's score; verifiers knows
other servers' context refusals by their words, the harness's client knows rlcode's by
its code (context_length_exceeded). A rubric of group reward functions (one score for
rollouts together) is refused: the harness plays and scores one episode a call.

Building an environment installs verifiers' SIGINT and SIGTERM handlers (its teardown);
`load` and `rows_env` put the process's own back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlcode.data.tasks import Task
from rlcode.errors import BadInput, MissingInput
from rlcode.harness.recorder import HEADER
from rlcode.paths import resolve

ROW_KEYS = ("question", "answer", "info")
SPLITS = ("train", "eval")


def exact_match(parser, completion, answer) -> float:
  """1.0 when the reply (the parser's answer: the last assistant message's text) is the
  answer, both stripped of surrounding whitespace."""
  return float((parser.parse_answer(completion) or "").strip() == str(answer).strip())


def read_rows(path: str) -> list[dict]:
  """The rows of a JSON-lines file of {"question", "answer"[, "info"]} objects (info kept
  as JSON text, which verifiers reads back); one line naming the file and line for
  anything else."""
  where = f"config.harness.verifiers.rows={path!r}"
  full = resolve(path)
  if not os.path.isfile(full):
    raise MissingInput(f"{where}: no such file")
  rows = []
  with open(full, encoding="utf-8") as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except ValueError as e:
        raise BadInput(f"{path}:{i}: not a JSON object ({e})") from None
      if not isinstance(row, dict) or not all(isinstance(row.get(k), str)
                                              for k in ("question", "answer")):
        raise BadInput(f"{path}:{i}: a row is an object with a string \"question\" and "
                       "\"answer\"")
      unknown = sorted(set(row) - set(ROW_KEYS))
      if unknown:
        raise BadInput(f"{path}:{i}: a row has no field {unknown[0]!r}; fields: "
                       f"{', '.join(ROW_KEYS)}")
      if "info" in row:
        if not isinstance(row["info"], dict):
          raise BadInput(f"{path}:{i}: \"info\" is an object")
        row["info"] = json.dumps(row["info"], sort_keys=True)
      rows.append(row)
  if not rows:
    raise BadInput(f"{where}: the file holds no rows")
  return rows


@contextlib.contextmanager
def _building():
  """Around building an environment: puts back the SIGINT and SIGTERM handlers verifiers
  replaces, and drops the errors its loader logs (the BadInput raised is the one line)."""
  saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  logger = logging.getLogger("verifiers.legacy.utils.env_utils")
  drop = lambda record: record.levelno < logging.ERROR
  logger.addFilter(drop)
  try:
    yield
  finally:
    logger.removeFilter(drop)
    for s, handler in saved.items():
      signal.signal(s, handler)


def rows_env(rows: Sequence[Mapping], funcs: Sequence[Callable] | None = None,
             weights: Sequence[float] | None = None, system_prompt: str | None = None):
  """A vf.SingleTurnEnv of `rows` (question/answer mappings) whose rubric is `funcs`
  (verifiers reward functions, weighted by `weights`; default: `exact_match`)."""
  import datasets
  import verifiers as vf
  datasets.disable_progress_bars()
  rubric = vf.Rubric(funcs=list(funcs or [exact_match]),
                     weights=list(weights) if weights is not None else None)
  with _building():
    return vf.SingleTurnEnv(dataset=datasets.Dataset.from_list([dict(r) for r in rows]),
                            system_prompt=system_prompt, rubric=rubric)


def load(section):
  """The environment config.harness.verifiers describes (`env` by name, else `rows`)."""
  import verifiers as vf
  if section.rows is not None:
    env = rows_env(read_rows(section.rows), system_prompt=section.system_prompt)
  else:
    where = f"config.harness.verifiers.env={section.env!r}"
    args = section.args.to_dict() if hasattr(section.args, "to_dict") else dict(section.args)
    try:
      with _building():
        env = vf.load_environment(section.env, **args)
    except (ValueError, RuntimeError, KeyError) as e:  # verifiers' words for a bad name
      raise BadInput(f"{where}: {' '.join(str(e).split())}") from None
    if not isinstance(env, vf.Environment):
      raise BadInput(f"{where}: load_environment returned a {type(env).__name__}, not a "
                     "verifiers Environment (the classic API this harness drives)")
  if env.requires_group_rollouts:
    raise BadInput("config.harness.verifiers: the environment's rubric scores rollouts in "
                   "groups (group reward functions); the harness plays and scores one "
                   "episode a call")
  return env


def _text(content: Any) -> str:
  """A message's content as text (a list of parts: its text parts)."""
  if isinstance(content, list):
    return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
  return "" if content is None else str(content)


def tasks(env, split: str) -> list[Task]:
  """The rows of the environment's dataset ("train") or eval dataset ("eval") as Tasks of
  kind "verifiers", sorted by id (the row's example_id): prompt, the row's messages as
  "role: content" lines; reference, its answer when that is text; extra, the row."""
  if split not in SPLITS:
    raise BadInput(f"config.data.train_split={split!r}: a verifiers environment's splits "
                   f"are {', '.join(map(repr, SPLITS))} (its dataset and its eval dataset)")
  try:
    dataset = env.get_dataset() if split == "train" else env.get_eval_dataset()
  except ValueError as e:
    raise BadInput(f"config.data.train_split={split!r}: {e}") from None
  out, seen, name = [], set(), env.env_id or ""
  for row in dataset.to_list():
    example = row["example_id"]
    task_id = f"{example:06d}" if isinstance(example, int) else str(example)
    if task_id in seen:
      raise BadInput(f"verifiers environment {name!r}: two rows have example_id {example!r}")
    seen.add(task_id)
    prompt = row["prompt"]
    text = (_text(prompt) if not isinstance(prompt, list) else
            "\n".join(f"{m.get('role')}: {_text(m.get('content'))}" for m in prompt))
    answer = row.get("answer")
    out.append(Task(id=task_id, prompt=text, kind="verifiers",
                    reference=answer if isinstance(answer, str) else "",
                    extra={"env": name, "row": row}))
  if not out:
    raise BadInput(f"verifiers environment {name!r}: its {split} dataset has no rows")
  return sorted(out, key=lambda t: t.id)


def failure(error: Mapping | None) -> str | None:
  """Why an episode whose RolloutOutput carries `error` (verifiers' error data) fails, or
  None when the error is the policy's own outcome (module docstring)."""
  if not error:
    return None
  from verifiers import errors
  chain = f"{error.get('error_chain_repr', '')} {error.get('error_chain_str', '')}"
  cls = getattr(errors, str(error.get("error")), None)
  if not (isinstance(cls, type) and issubclass(cls, errors.Error)):
    return chain.strip() or str(error)
  if issubclass(cls, errors.EmptyModelResponseError):
    return None
  if issubclass(cls, (errors.ModelError, errors.InfraError)):
    return chain.strip()
  return None


class Harness:
  """harness(task, base_url, api_key, episode_id): one rollout of a verifiers environment
  on a Task of `tasks` through the OpenAI API at base_url; returns its RolloutOutput
  (RuntimeError on a failed episode, `failure`).

  Args:
    env: the environment (`load`).
    model: the served model's name.
    temperature: the sampling temperature (rl.temperature).
    max_tokens: each call's max_tokens; None: the environment's, else the server's default.
    timeout: the openai client's per-request timeout, seconds.
    transport: an httpx transport for the client (tests answer calls with one).
  """

  def __init__(self, env, *, model: str, temperature: float = 1.0,
               max_tokens: int | None = None, timeout: float = 600.0, transport=None):
    self.env, self.model, self.timeout, self.transport = env, model, timeout, transport
    own = {"temperature": temperature, "max_tokens": max_tokens}
    self.sampling_args = {**dict(env.sampling_args), **{k: v for k, v in own.items()
                                                         if v is not None}}

  def __call__(self, task: Task, base_url: str, api_key: str, episode_id: str):
    output = asyncio.run(self._rollout(dict(task.extra.row), base_url, api_key, episode_id))
    why = failure(output.get("error"))
    if why is not None:
      raise RuntimeError(f"the rollout stopped on an error: {why}")
    return output

  async def _rollout(self, row: dict, base_url: str, api_key: str, episode_id: str):
    import httpx
    import openai
    http = httpx.AsyncClient(transport=self.transport) if self.transport is not None else None
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                timeout=self.timeout, default_headers={HEADER: episode_id},
                                http_client=http)
    try:
      return await self.env.run_rollout(row, _chat_client()(client), self.model,
                                        dict(self.sampling_args))
    finally:
      await client.close()


@functools.cache
def _chat_client():
  """vf.OpenAIChatCompletionsClient that knows rlcode's refusal of a conversation past the
  context (a 400 of code context_length_exceeded) as verifiers' OverlongPromptError, as it
  knows other servers' by their messages."""
  import openai
  import verifiers as vf

  class ChatClient(vf.OpenAIChatCompletionsClient):
    async def get_native_response(self, *args, **kwargs):
      try:
        return await super().get_native_response(*args, **kwargs)
      except openai.BadRequestError as e:
        if getattr(e, "code", None) == "context_length_exceeded":
          raise vf.OverlongPromptError(str(e)) from e
        raise

  return ChatClient
