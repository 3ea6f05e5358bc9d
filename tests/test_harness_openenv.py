"""OpenEnv environments as the harness trainer's episodes (rlcode.harness.openenv_env).

Units, without JAX: rlcode's code tasks as an OpenEnv environment, served by openenv's own
app on a loopback port of this process and driven by openenv's own client (a WebSocket
session): a task's reference solution scores 1 and ends the episode, a wrong body scores 0
and draws the feedback observation, the last turn ends it, a bad task id is openenv's
error; the server stops and refuses connections. The harness on a stub OpenAI transport
against that server: what reaches /v1/completions (the episode's header, the model,
temperature, max_tokens; each prompt the whole episode so far) and the return it reports.
A wrong harness.openenv setting is one line through the CLI.

End to end (slow): configs/harness_openenv.py:smoke at a toy model size through
rlcode.cli.main, 3 GRPO steps of 2 tasks x 4 episodes of data/tiny_tasks.jsonl.
"""

import json
import os

import httpx
import pytest

from rlcode import cli
from rlcode.data.tasks import Task
from rlcode.harness import openenv_env
from rlcode.harness.examples import FEEDBACK
import tiny_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "harness_openenv.py") + ":smoke"
TINY = tiny_runs.SMALL_JOB


def _tasks(n=2):
  with open(os.path.join(ROOT, "data", "tiny_tasks.jsonl")) as f:
    rows = [json.loads(line) for line, _ in zip(f, range(n))]
  return [Task(**{k: r[k] for k in ("id", "prompt", "reference", "tests", "entry_point")})
          for r in rows]


@pytest.fixture(scope="module")
def served():
  tasks = _tasks()
  with openenv_env.EnvServer(tasks, max_turns=2, sessions=4) as server:
    yield server, tasks


def test_reference_scores_one_and_ends_the_episode(served):
  server, tasks = served
  task = tasks[0]
  with openenv_env.connect(server.url) as env:
    first = env.reset(task_id=task.id, episode_id="e1")
    assert first.observation.text == task.prompt and not first.done and first.reward is None
    result = env.step(openenv_env.CodeAction(text=task.reference))
    assert result.reward == 1.0 and result.done and result.observation.passed
    assert result.observation.text == "" and result.observation.turn == 1
    state = env.state()
    assert state.task_id == task.id and state.episode_id == "e1" and state.step_count == 1
    with pytest.raises(RuntimeError, match="has ended"):
      env.step(openenv_env.CodeAction(text=task.reference))


def test_a_wrong_body_scores_zero_and_draws_feedback_until_the_last_turn(served):
  server, tasks = served
  task = tasks[1]
  with openenv_env.connect(server.url) as env:
    env.reset(task_id=task.id)
    result = env.step(openenv_env.CodeAction(text="    return None\n"))
    assert result.reward == 0.0 and not result.done and not result.observation.passed
    assert result.observation.text == FEEDBACK[False] + task.prompt
    result = env.step(openenv_env.CodeAction(text="    return None\n"))
    assert result.reward == 0.0 and result.done and result.observation.text == ""
    # A new episode on the same session starts over.
    assert not env.reset(task_id=task.id).done
    with pytest.raises(RuntimeError, match="no task 'nope'"):
      env.reset(task_id="nope")


def _reply(text):
  return httpx.Response(200, json={
      "id": "c", "object": "text_completion", "created": 0, "model": "rlcode",
      "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": None}],
      "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})


def test_the_harness_extends_one_prompt_and_returns_the_episode_return(served):
  server, tasks = served
  task = tasks[0]
  answers = iter(["    return 0\n", task.reference])
  seen = []

  def handler(request):
    seen.append(request)
    return _reply(next(answers))
  harness = openenv_env.Harness(server.url, model="rlcode", temperature=0.7, max_tokens=40,
                                transport=httpx.MockTransport(handler))
  result = harness(task, "http://stub/v1", "KEY", "s0-g0-e0-abc")
  assert result == {"reward": 1.0, "turns": 2, "passed": True, "truncated": False,
                    "completions": ["    return 0\n", task.reference]}
  bodies = [json.loads(r.content) for r in seen]
  assert all(r.url.path == "/v1/completions" for r in seen)
  assert all(r.headers["X-Episode-Id"] == "s0-g0-e0-abc" for r in seen)
  assert all(b["model"] == "rlcode" and b["temperature"] == 0.7 and b["max_tokens"] == 40
             for b in bodies)
  assert bodies[0]["prompt"] == task.prompt
  assert bodies[1]["prompt"] == task.prompt + "    return 0\n" + FEEDBACK[False] + task.prompt
  # A history past the context ends the episode with the return so far.
  refused = httpx.Response(400, json={"error": {"message": "too long", "type": "x",
                                                "param": None,
                                                "code": "context_length_exceeded"}})
  harness.transport = httpx.MockTransport(lambda request: refused)
  assert harness(task, "http://stub/v1", "KEY", "e2") == {
      "reward": 0.0, "turns": 0, "passed": False, "completions": [], "truncated": True}


def test_the_server_stops_cleanly():
  server = openenv_env.EnvServer(_tasks(1), max_turns=1)
  url = server.url
  with openenv_env.connect(url) as env:
    assert not env.reset(task_id=_tasks(1)[0].id).done
  server.close()
  assert not server.running
  with pytest.raises(ConnectionError):
    openenv_env.connect(url, connect_timeout_s=2).connect()


@pytest.mark.parametrize("override, said", [
    (["--config.harness.openenv.max_turns=0"], "config.harness.openenv.max_turns"),
    (["--config.harness.harness=rlcode.harness.examples:two_call_agent"], "set one of"),
])
def test_bad_openenv_settings_are_one_line(tmp_path, capfd, override, said):
  assert cli.main(["train", "--config", CONFIG, *TINY, f"--config.workdir={tmp_path}",
                   *override]) == 2
  err = capfd.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err and said in err, err


@pytest.mark.slow
def test_three_grpo_steps_of_an_openenv_environment(tmp_path):
  workdir = str(tmp_path / "run")
  assert cli.main(["train", "--config", CONFIG, *TINY, f"--config.workdir={workdir}"]) == 0
  rows = tiny_runs.metrics_rows(workdir)
  assert [r["step"] for r in rows] == [1, 2, 3]
  for r in rows:
    # 2 tasks x 4 episodes of 1-2 completion calls each, none failed, every group trained.
    assert r["episodes"] == 8 and r["failed_episodes"] == 0 and r["dropped_groups"] == 0
    assert 1 <= r["calls_per_episode"] <= 2 and r["trained_tokens"] > 0
    assert r["update_skipped"] == 0 and r["stale_tokens"] == 0
    assert r["reward_mean"] * 8 == round(r["reward_mean"] * 8)  # a return of 0 or 1 each
