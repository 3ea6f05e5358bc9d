"""DAPO's dynamic sampling in the GRPO loop (rlcode.rl.dynamic, shared with the agent loop):
rounds of rollouts joined into one batch of the groups with a signal, the config's
refusals, and tiny runs that log the rounds and reproduce themselves."""

import os
from types import SimpleNamespace

import numpy as np
import pytest

import tiny_runs
from rlcode import cli, rewards
from rlcode.agent import step_groups
from rlcode.data.tasks import Task
from rlcode.rl import dynamic, rollout
from rlcode.sampling import Generation
from rlcode.train import grpo_loop

GRPO = os.path.join(tiny_runs.ROOT, "configs", "grpo_tiny.py")
G = 2


def _round(r, scores):
  """A scored rollout of len(scores) / G tasks, each row tagged (round, row) in its texts,
  tokens and log-probs, and its advantages (the scores, centred per group)."""
  n = len(scores)
  p = n // G
  tokens = np.array([[100 * r + i] * 3 for i in range(n)], np.int32)
  gen = Generation(tokens=tokens, logprobs=-tokens.astype(np.float32) / 1000,
                   lengths=np.full(n, 2 + r % 2, np.int32), finished=np.arange(n) % 2 == 0,
                   prompt_index=np.repeat(np.arange(p), G))
  ro = rollout.Rollout(
      tasks=[Task(id=f"t{r}.{j}", prompt=f"p{r}.{j}") for j in range(p)],
      prompts=[[r, j] for j in range(p)], generation=gen,
      texts=[f"{r}:{i}" for i in range(n)], seconds=1.0 + r,
      tokenizer=SimpleNamespace(pad_id=0),
      reward=rewards.RewardOutput(scores=np.array(scores, np.float32),
                                  metrics={"m": float(r)},
                                  details=[{"row": (r, i)} for i in range(n)]),
      loss_lengths=np.full(n, 1 + r, np.int32))
  s = np.array(scores, np.float32).reshape(-1, G)
  return ro, (s - s.mean(1, keepdims=True)).reshape(-1), 0.5


def test_rounds_keep_the_groups_with_a_signal_and_join_them():
  # Three rounds of three groups of 2; the groups with a signal: round 0 its second,
  # round 1 its first, round 2 its first two (as the agent loop's test of the rule).
  scores = [[1, 1, 0, 1, 0, 0], [1, 0, 1, 1, 0, 0], [0, 1, 1, 0, 1, 1]]
  calls = []

  def sample(r):
    calls.append(r)
    return _round(r, scores[r])

  ro, adv, reward_s, metrics = dynamic.fill_rollouts(sample, G, 3, rounds=3)
  assert calls == [0, 1, 2]
  assert metrics == {"sample_rounds": 3.0, "sampled_groups_with_signal": 4 / 9}
  rows = [(0, 2), (0, 3), (1, 0), (1, 1), (2, 0), (2, 1)]
  assert ro.texts == [f"{r}:{i}" for r, i in rows]
  assert [t.id for t in ro.tasks] == ["t0.1", "t1.0", "t2.0"]
  assert ro.prompts == [[0, 1], [1, 0], [2, 0]]
  np.testing.assert_array_equal(ro.generation.tokens[:, 0], [100 * r + i for r, i in rows])
  np.testing.assert_array_equal(ro.generation.logprobs[:, 0],
                                np.float32([-(100 * r + i) / 1000 for r, i in rows]))
  np.testing.assert_array_equal(ro.generation.prompt_index, [0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(ro.generation.lengths, [2, 2, 3, 3, 2, 2])
  np.testing.assert_array_equal(ro.generation.finished, [True, False] * 3)
  np.testing.assert_array_equal(ro.loss_lengths, [1, 1, 2, 2, 3, 3])
  np.testing.assert_array_equal(ro.reward.scores, [scores[r][i] for r, i in rows])
  assert [d["row"] for d in ro.reward.details] == rows
  assert ro.reward.metrics == {"m": 1.0} and ro.seconds == 6.0 and reward_s == 1.5
  np.testing.assert_array_equal(adv, [-0.5, 0.5, 0.5, -0.5, -0.5, 0.5])
  assert ro.group_size == G and rollout.batch_widths(ro) == (2, 2)
  # Capped at two rounds: the last round's first flat group fills the third place.
  ro, adv, _, metrics = dynamic.fill_rollouts(sample, G, 3, rounds=2)
  assert metrics["sample_rounds"] == 2 and [t.id for t in ro.tasks] == ["t0.1", "t1.0", "t1.1"]
  np.testing.assert_array_equal(adv, [-0.5, 0.5, 0.5, -0.5, 0, 0])
  # One round: the round's own rollout, untouched, and no metrics.
  first = sample(0)
  calls.clear()
  got = dynamic.fill_rollouts(lambda r: first, G, 3, rounds=1)
  assert got[0] is first[0] and got[1] is first[1] and got[3] == {}


def test_the_agent_loop_uses_the_same_rule():
  assert step_groups.fill_with_signal is dynamic.fill_with_signal
  assert step_groups.has_signal is dynamic.has_signal
  assert dynamic.round_seed(3, 5, 0) == 3 * 1_000_003 + 5  # the plain loop's seed


@pytest.mark.parametrize("flags, needle", [
    (["--config.rl.sample_rounds=2", "--config.rl.rollouts=partial",
      "--config.rl.max_staleness=1"], "rl.sample_rounds=2 needs rl.rollouts=batch"),
    (["--config.rl.sample_rounds=0"], "config.rl.sample_rounds=0: must be >= 1"),
])
def test_bad_sampling_settings_are_one_line(capsys, flags, needle):
  assert cli.main(["config", "show", GRPO, *flags]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and needle in err, err


@pytest.mark.slow
def test_grpo_runs_rounds_until_groups_have_a_signal_and_reproduces(tmp_path):
  """Two tiny GRPO steps with up to 3 rounds: the rounds and the share of drawn groups with
  a signal are logged, the trained batch has at least that share, and a second run with
  the same seed logs the same numbers (each round draws from (seed, step, round))."""
  runs = [tiny_runs.steps(grpo_loop.train(tiny_runs.config(
      str(tmp_path / name), "--config.rl.sample_rounds=3"))) for name in ("a", "b")]
  assert runs[0] == runs[1] and len(runs[0]) == 2
  for r in runs[0]:
    assert r["sample_rounds"] in (1.0, 2.0, 3.0) and 0 <= r["sampled_groups_with_signal"] <= 1
    assert r["groups_with_signal"] >= r["sampled_groups_with_signal"]
    assert r["groups_with_signal"] == 1.0 or r["sample_rounds"] == 3.0
    assert np.isfinite(r["loss"]) and not r["skipped"]
