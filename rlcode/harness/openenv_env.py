"""OpenEnv (Meta's `openenv-core`, the environment protocol TRL trains on) as the harness
trainer's episodes: rlcode's code tasks as an OpenEnv environment, served by openenv's own
app in this process, played through openenv's own client (rlcode.train.harness_loop with
config.harness.openenv; configs/harness_openenv.py).

`CodeTasksEnv` is an openenv Environment: reset(task_id=...) starts an episode on that task
(the observation's text is its prompt); step(CodeAction(text=...)) runs the task's tests on
the completion through rlcode's rewards registry (the sandbox, `examples.tests_pass`) and
returns reward 1.0 when they pass, else 0.0. The episode ends when the tests pass or after
`max_turns` steps; after a failed attempt that leaves turns, the observation's text says
so and asks again (examples.FEEDBACK[False], then the prompt once more).

`EnvServer` serves it: openenv's `create_fastapi_app` (its /reset, /step, /state, /ws
routes; every WebSocket connection with an environment of its own) under uvicorn on a
thread, on a port of 127.0.0.1 the OS picks; no container. `close` (or leaving the `with`)
stops it. `CodeEnvClient` is openenv's EnvClient (one WebSocket connection) of its types.

`Harness` is the harness callable: an episode opens a connection, resets it to the task, then
asks rlcode's server (the openai client, POST /v1/completions, the X-Episode-Id header, at
rl.temperature) for each action: the prompt is the whole episode so far (the first
observation, then each completion followed by the observation it drew), so every call
extends the previous call's text and the episode is one segment wherever the text
round-trips its tokens. It returns {"reward": the episode's return (the sum of its steps'
rewards), "turns", "passed", "completions", "truncated"}. A call refused because the
history has outgrown the context (code context_length_exceeded) ends the episode with the
return so far ("truncated": the policy's outcome, as verifiers' OverlongPromptError); any
other failure of the model's API or of the environment raises, which fails the episode.

Approximations: the environment is rlcode's own (its tasks are config.data's), not an
environment from OpenEnv's hub, whose servers run in containers; the actions are raw
completion text, not chat messages.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Iterable, Mapping
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server import Action, Environment, Observation, State
from pydantic import Field

from rlcode.data.tasks import Task
from rlcode.harness.examples import FEEDBACK, tests_pass
from rlcode.harness.recorder import HEADER
from rlcode import web

log = logging.getLogger(__name__)


class CodeAction(Action):
  """An attempt at the task: the text that completes its prompt."""

  text: str = Field(description="the completion of the task's prompt (a function's body)")


class CodeObservation(Observation):
  """What the policy reads next (reward and done are openenv's fields)."""

  text: str = Field(default="", description="the prompt at reset; after a failed attempt "
                    "that leaves turns, the feedback and the prompt again; else empty")
  turn: int = Field(default=0, description="attempts made so far")
  passed: bool = Field(default=False, description="whether the last attempt passed")


class CodeState(State):
  """The episode's state: openenv's episode_id and step_count, the task and its outcome."""

  task_id: str | None = None
  passed: bool = False


class CodeTasksEnv(Environment[CodeAction, CodeObservation, CodeState]):
  """rlcode's code tasks as an OpenEnv environment (module docstring). A connection's own
  instance; instances share nothing mutable, so connections run concurrently.

  Args:
    tasks: the tasks by id.
    max_turns: attempts an episode allows.
  """

  SUPPORTS_CONCURRENT_SESSIONS = True

  def __init__(self, tasks: Mapping[str, Task], max_turns: int):
    super().__init__()
    self.tasks, self.max_turns = tasks, max_turns
    self._task: Task | None = None
    self._state = CodeState()

  def reset(self, seed: int | None = None, episode_id: str | None = None,
            task_id: str | None = None, **kwargs: Any) -> CodeObservation:
    del seed, kwargs
    if task_id not in self.tasks:
      raise ValueError(f"no task {task_id!r} (reset takes task_id, one of the served tasks)")
    self._task = self.tasks[task_id]
    self._state = CodeState(episode_id=episode_id, task_id=task_id)
    return CodeObservation(text=self._task.prompt)

  def step(self, action: CodeAction, timeout_s: float | None = None,
           **kwargs: Any) -> CodeObservation:
    del timeout_s, kwargs
    st = self._state
    if self._task is None:
      raise RuntimeError("step before reset")
    if st.passed or st.step_count >= self.max_turns:
      raise RuntimeError(f"episode {st.episode_id!r} has ended; reset for another")
    passed = tests_pass(self._task, action.text) == 1.0
    st.step_count += 1
    st.passed = passed
    done = passed or st.step_count >= self.max_turns
    return CodeObservation(text="" if done else FEEDBACK[False] + self._task.prompt,
                           turn=st.step_count, passed=passed, reward=float(passed), done=done)

  @property
  def state(self) -> CodeState:
    return self._state


class CodeEnvClient(EnvClient[CodeAction, CodeObservation, CodeState]):
  """openenv's client (a WebSocket connection) of `CodeTasksEnv`'s types."""

  def _step_payload(self, action: CodeAction) -> dict:
    return action.model_dump()

  def _parse_result(self, payload: dict) -> StepResult[CodeObservation]:
    reward, done = payload.get("reward"), bool(payload.get("done", False))
    obs = CodeObservation(**payload.get("observation", {}), reward=reward, done=done)
    return StepResult(observation=obs, reward=reward, done=done)

  def _parse_state(self, payload: dict) -> CodeState:
    return CodeState(**payload)


def connect(url: str, **kwargs):
  """A synchronous `CodeEnvClient` of the server at `url` (a context manager; `kwargs` go to
  EnvClient): openenv-core's EnvClient is async and wraps itself with `.sync()`."""
  return CodeEnvClient(url, **kwargs).sync()


class EnvServer:
  """`CodeTasksEnv` of `tasks` served by openenv's create_fastapi_app under uvicorn on a
  thread of this process (a context manager; `close` stops it).

  Args:
    tasks: the tasks episodes may reset to (by id).
    max_turns: attempts an episode allows.
    sessions: WebSocket connections open at once (openenv refuses one more).
    host: the loopback address to listen on; the OS picks the port.
    start_timeout: seconds to wait for it to listen.
  """

  def __init__(self, tasks: Iterable[Task], max_turns: int, *, sessions: int = 64,
               host: str = "127.0.0.1", start_timeout: float = 30.0):
    import uvicorn
    from openenv.core.env_server import create_fastapi_app

    by_id = {t.id: t for t in tasks}
    app = create_fastapi_app(functools.partial(CodeTasksEnv, by_id, max_turns), CodeAction,
                             CodeObservation, max_concurrent_envs=sessions)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                                 lifespan="on"))
    self._thread, started = web.start_in_thread(self._server, sock, "rlcode-openenv-server",
                                                start_timeout)
    if not started:
      self.close()
      raise RuntimeError(f"the OpenEnv server on {host} did not start")
    bound = sock.getsockname()
    self.url = f"http://{bound[0]}:{bound[1]}"
    log.info("OpenEnv environment of %d tasks at %s", len(by_id), self.url)

  @property
  def running(self) -> bool:
    return self._thread.is_alive()

  def close(self) -> None:
    """Stops listening and closes its sessions."""
    if self._thread.is_alive():
      self._server.should_exit = True
      self._thread.join()

  def __enter__(self) -> EnvServer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class Harness:
  """harness(task, base_url, api_key, episode_id): one episode of the OpenEnv environment at
  `env_url` on `task`, its actions sampled from the policy at base_url (module docstring).

  Args:
    env_url: the environment server's URL (`EnvServer.url`).
    model: the served model's name.
    temperature: the sampling temperature (rl.temperature).
    max_tokens: each call's max_tokens; None: the server's default.
    timeout: the openai client's per-request timeout and the environment's per-message
      timeout, seconds.
    transport: an httpx transport for the openai client (tests answer calls with one).
  """

  def __init__(self, env_url: str, *, model: str, temperature: float = 1.0,
               max_tokens: int | None = None, timeout: float = 600.0, transport=None):
    self.env_url, self.model, self.timeout, self.transport = env_url, model, timeout, transport
    self.sampling = {"temperature": temperature,
                     **({"max_tokens": max_tokens} if max_tokens is not None else {})}

  def __call__(self, task: Task, base_url: str, api_key: str, episode_id: str) -> dict:
    import httpx
    import openai
    http = httpx.Client(transport=self.transport) if self.transport is not None else None
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                           timeout=self.timeout, default_headers={HEADER: episode_id},
                           http_client=http)
    total, completions, truncated = 0.0, [], False
    try:
      with connect(self.env_url, message_timeout_s=self.timeout) as env:
        result = env.reset(task_id=task.id, episode_id=episode_id)
        history = result.observation.text
        while not result.done:
          try:
            reply = client.completions.create(model=self.model, prompt=history,
                                              **self.sampling)
          except openai.BadRequestError as e:
            if getattr(e, "code", None) != "context_length_exceeded":
              raise
            truncated = True
            break
          text = reply.choices[0].text
          completions.append(text)
          result = env.step(CodeAction(text=text))
          total += float(result.reward or 0.0)
          history += text + result.observation.text
    finally:
      client.close()
    return {"reward": total, "turns": len(completions), "passed": result.observation.passed,
            "completions": completions, "truncated": truncated}
