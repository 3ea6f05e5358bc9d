"""`verifiers` environments as the harness trainer's episodes (rlcode.harness.verifiers_env).

Units, without JAX: an environment of local rows as Tasks; the harness's rollout on a stub
HTTP transport (what reaches the server: the chat endpoint, the episode's header, the
model, temperature and max_tokens; the reward is the rubric's; which errors fail an
episode); bad rows and names are one line through the CLI.

End to end (slow): configs/harness_verifiers.py:smoke at a toy model size through
rlcode.cli.main, 3 GRPO steps of a SingleTurnEnv of data/verifiers_tiny.jsonl scored by
exact match, every call recorded as the engine sampled it; then one step of an environment
loaded by name through verifiers' own load_environment (this module's, below) whose
rubric gives every rollout 0.25: the step's reward_mean is 0.25, so the rewards trained
are the rubric's.
"""

import json
import os

import httpx
import pytest

from rlcode import cli
from rlcode.errors import BadInput, MissingInput
from rlcode.harness import verifiers_env
import tiny_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "harness_verifiers.py") + ":smoke"
ROWS = os.path.join(ROOT, "data", "verifiers_tiny.jsonl")
TINY = tiny_runs.SMALL_JOB
ROWS_3 = [{"question": "What is 2+3?", "answer": "5"},
          {"question": "Reverse 'ab'.", "answer": "ba"},
          {"question": "Upper-case 'ox'.", "answer": "OX"}]


def load_environment(reward: float = 0.25):
  """An environment verifiers' load_environment finds by this module's name: the rows of
  data/verifiers_tiny.jsonl, every rollout scored `reward` by its rubric."""
  def constant(completion) -> float:
    del completion
    return reward
  return verifiers_env.rows_env(verifiers_env.read_rows(ROWS), funcs=[constant])


def test_rows_become_tasks_of_kind_verifiers():
  env = verifiers_env.rows_env(ROWS_3, system_prompt="Answer briefly.")
  tasks = verifiers_env.tasks(env, "train")
  assert [t.id for t in tasks] == ["000000", "000001", "000002"]
  t = tasks[1]
  assert t.kind == "verifiers" and t.reference == "ba"
  assert t.prompt == "system: Answer briefly.\nuser: Reverse 'ab'."
  assert t.extra.row["answer"] == "ba" and t.extra.row["example_id"] == 1
  assert [m["role"] for m in t.extra.row["prompt"]] == ["system", "user"]
  with pytest.raises(BadInput, match="splits are 'train', 'eval'"):
    verifiers_env.tasks(env, "validation")


def _reply(content, status=200, code=None):
  if status != 200:
    return httpx.Response(status, json={"error": {"message": "refused", "type": "x",
                                                  "param": None, "code": code}})
  return httpx.Response(200, json={
      "id": "c", "object": "chat.completion", "created": 0, "model": "rlcode",
      "choices": [{"index": 0, "finish_reason": "stop",
                   "message": {"role": "assistant", "content": content}}],
      "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})


def _play(env, task, answer):
  """One episode on a stub server answering `answer` (a reply's content, or an
  httpx.Response); returns (the result, the requests it saw)."""
  seen = []

  def handler(request):
    seen.append(request)
    return answer if isinstance(answer, httpx.Response) else _reply(answer)
  harness = verifiers_env.Harness(env, model="rlcode", temperature=0.7, max_tokens=8,
                                  transport=httpx.MockTransport(handler))
  return harness(task, "http://stub/v1", "KEY", "s0-g0-e0-abc"), seen


def test_the_harness_plays_the_row_and_returns_the_rubric_score():
  env = verifiers_env.rows_env(ROWS_3)
  task = verifiers_env.tasks(env, "train")[0]
  result, seen = _play(env, task, " 5\n")
  assert len(seen) == 1
  call = seen[0]
  assert call.url.path == "/v1/chat/completions"
  assert call.headers["X-Episode-Id"] == "s0-g0-e0-abc"
  assert call.headers["Authorization"] == "Bearer KEY"
  body = json.loads(call.content)
  assert body["model"] == "rlcode" and body["temperature"] == 0.7
  assert body["max_completion_tokens"] == 8 and body["n"] == 1
  assert body["messages"] == [{"role": "user", "content": "What is 2+3?"}]
  assert result["reward"] == 1.0 and result["metrics"]["exact_match"] == 1.0
  assert _play(env, task, "6")[0]["reward"] == 0.0
  # An empty reply is the policy's: scored (0), not failed.
  assert _play(env, task, "")[0]["reward"] == 0.0
  # A conversation past the context is verifiers' overlong prompt: scored, not failed.
  assert _play(env, task, _reply(None, 400, "context_length_exceeded"))[0]["reward"] == 0.0
  # Any other refusal of the model's API fails the episode.
  with pytest.raises(RuntimeError, match="rollout stopped on an error: ModelError"):
    _play(env, task, _reply(None, 400, "invalid_value"))


def test_rows_that_are_not_question_answer_objects_are_one_line(tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"question": "q", "answer": "a"}\n{"question": "q"}\n')
  with pytest.raises(BadInput, match=r"bad.jsonl:2: a row is an object with a string"):
    verifiers_env.read_rows(str(bad))
  bad.write_text('{"question": "q", "answer": "a", "extra": 1}\n')
  with pytest.raises(BadInput, match="no field 'extra'"):
    verifiers_env.read_rows(str(bad))
  with pytest.raises(MissingInput, match="no such file"):
    verifiers_env.read_rows(str(tmp_path / "none.jsonl"))
  # Through the CLI: one line, exit 2, before any model is built.
  bad.write_text("{not json\n")
  assert cli.main(["train", "--config", CONFIG, *TINY, f"--config.workdir={tmp_path}/w",
                   f"--config.harness.verifiers.rows={bad}"]) == 2


@pytest.mark.parametrize("override, said", [
    (["--config.harness.verifiers.rows=None",
      "--config.harness.verifiers.env=no_such_env_xyz"],
     "config.harness.verifiers.env='no_such_env_xyz': Could not import"),
    (["--config.data.source=jsonl", "--config.data.path=data/tiny_tasks.jsonl"],
     "config.data.source='jsonl': 'verifiers'"),
    (["--config.harness.verifiers.rows=data/nothing_here.jsonl"], "no such file"),
])
def test_bad_environments_are_one_line(tmp_path, capfd, override, said):
  assert cli.main(["train", "--config", CONFIG, *TINY, f"--config.workdir={tmp_path}",
                   *override]) == 2
  err = capfd.readouterr().err  # the descriptor's: what verifiers' own log handler writes too
  assert err.count("\n") == 1 and "Traceback" not in err and said in err, err



@pytest.mark.slow
def test_three_grpo_steps_of_a_verifiers_environment(tmp_path):
  workdir = str(tmp_path / "rows")
  assert cli.main(["train", "--config", CONFIG, *TINY, f"--config.workdir={workdir}"]) == 0
  rows = tiny_runs.metrics_rows(workdir)
  assert [r["step"] for r in rows] == [1, 2, 3]
  for r in rows:
    # 2 rows x 4 episodes of one chat call each, none failed, every group trained.
    assert r["episodes"] == 8 and r["failed_episodes"] == 0 and r["dropped_groups"] == 0
    assert r["calls_per_episode"] == 1 and r["segments_per_episode"] == 1
    assert 0 < r["sampled_tokens_per_episode"] <= 8 and r["trained_tokens"] > 0
    assert r["update_skipped"] == 0 and r["stale_tokens"] == 0
    assert r["reward_mean"] * 8 == round(r["reward_mean"] * 8)  # exact match: 0 or 1 each
    # The update's log-probs of the recorded tokens are the server's (on policy).
    assert r["ratio"] == pytest.approx(1.0, abs=1e-4)
  assert [r["policy_version"] for r in rows] == [0, 1, 2]

  # By name through verifiers' loader, its argument passed: the rubric's constant is the
  # reward of every episode.
  workdir = str(tmp_path / "named")
  assert cli.main(["train", "--config", CONFIG, *TINY, f"--config.workdir={workdir}",
                   "--config.harness.verifiers.rows=None",
                   "--config.harness.verifiers.env=test_harness_verifiers",
                   "--config.harness.verifiers.args.reward=0.375",
                   "--config.train.steps=1"]) == 0
  (r,) = tiny_runs.metrics_rows(workdir)
  assert r["reward_mean"] == 0.375 and r["reward_std"] == 0 and r["failed_episodes"] == 0
  assert r["trained_tokens"] > 0
