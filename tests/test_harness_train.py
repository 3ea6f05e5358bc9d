"""`rlcode train` of the harness trainer (rlcode.train.harness_loop) end to end: the smoke
variant of configs/harness_tiny.py at a toy model size, through rlcode.cli.main, in a tmp
workdir. The policy is served in process on 127.0.0.1 (the real app under uvicorn) and
the example harness (rlcode.harness.examples.two_call_agent) plays its episodes with the
openai client, running the tasks' tests in the sandbox between its calls. The reward is
the share of letters in the final body (the untrained policy passes no test, so the
tests' reward would leave every group without a signal).

Two steps, then a resume to a third: every step's row has the rollout metrics and a loss,
the policy version that sampled each step is the number of updates before it (0, 1, then
2 after the resume, which restored it from the checkpoint), and the resumed run drops no
row and starts where the checkpoint was. Bad harness paths are one line, exit 2.
"""

import os

import pytest

from rlcode import cli
import tiny_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "harness_tiny.py") + ":smoke"
TINY = tiny_runs.SMALL_JOB
ROLLOUT = ("episodes", "failed_episodes", "dropped_groups", "segments_per_episode",
           "calls_per_episode", "trained_tokens", "reward_mean", "policy_version")


def letters_reward(task, result):
  """A reward the untrained policy's bytes vary in (the tests pass none of them): the
  share of ASCII letters in the final body. The job's harness.reward in this test, so
  that groups carry a signal and the update moves the policy."""
  del task
  return sum(c.isascii() and c.isalpha() for c in result["completion"]) / 40



@pytest.mark.slow
def test_the_smoke_job_trains_publishes_and_resumes(tmp_path):
  workdir = str(tmp_path / "run")
  args = ["train", "--config", CONFIG, *TINY, f"--config.workdir={workdir}",
          "--config.harness.reward=test_harness_train:letters_reward"]
  assert cli.main(args) == 0
  rows = tiny_runs.metrics_rows(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    assert all(k in r for k in ROLLOUT), sorted(r)
    # 2 tasks x 4 episodes of two calls each, none failed: every group trains.
    assert r["episodes"] == 8 and r["failed_episodes"] == 0 and r["dropped_groups"] == 0
    assert r["calls_per_episode"] == 2 and r["trained_tokens"] > 0
    assert r["update_skipped"] == 0 and r["stale_tokens"] == 0
    assert r["groups_with_signal"] > 0 and r["grad_norm"] > 0 and r["loss"] == r["loss"]
    # The update's log-probs of the served tokens are the server's (on policy).
    assert r["ratio"] == pytest.approx(1.0, abs=1e-4)
  assert [r["policy_version"] for r in rows] == [0, 1]

  # A resume for one more step starts from the last checkpoint, its version restored.
  assert cli.main(args + ["--config.train.steps=3"]) == 0
  rows = tiny_runs.metrics_rows(workdir)
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert rows[2]["policy_version"] == 2 and rows[2]["episodes"] == 8


@pytest.mark.parametrize("path, said", [
    ("no_such_module_xyz:agent", "cannot import 'no_such_module_xyz'"),
    ("rlcode.harness.examples:no_agent", "rlcode.harness.examples has no attribute 'no_agent'"),
    ("rlcode.harness.examples:MAX_TOKENS", "not a callable (an object of type int)"),
    ("rlcode.harness.examples", 'must be an import path "package.module:function"'),
])
def test_a_harness_that_does_not_resolve_is_one_line(tmp_path, capsys, path, said):
  argv = ["train", "--config", CONFIG, *TINY, f"--config.workdir={tmp_path}",
          f"--config.harness.harness={path}"]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err and said in err, err
  assert "harness.harness" in err, err
