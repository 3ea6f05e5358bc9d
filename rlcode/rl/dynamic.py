"""DAPO's dynamic sampling (Yu et al. 2025), with a cap on the rounds, for every loop.

A GRPO group teaches only when its rewards differ. With rl.sample_rounds = n > 1 a step
samples rounds of prompts_per_step tasks (the stream's next ones each round) until
prompts_per_step groups whose rewards differ are kept, or n rounds have run; a batch
still short then is filled with the last round's flat groups (advantages 0: with beta = 0
they add nothing to the gradient, as in plain GRPO). n = 1 is plain GRPO: the first
round as it came.

`fill_with_signal` is the rule on items of any kind (the agent loop's trajectories);
`fill_rollouts` applies it to the GRPO loop's rollouts, scored and turned into
advantages round by round, and joins the kept groups into one Rollout. Round r of step
k draws from `round_seed(seed, k, r)`; round 0's is the plain loop's seed, so a run with
one round samples exactly what it did without dynamic sampling.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlcode import rewards
from rlcode.rl import rollout as rollout_lib
from rlcode.sampling import Generation


def round_seed(seed: int, step: int, r: int) -> int:
  """The sampling seed of round r of step `step` (r = 0: the plain loop's)."""
  return seed * 1_000_003 + step + r * 104_729


def has_signal(group, reward) -> bool:
  """Whether a group's rewards (reward(item) of each) are not all equal."""
  return len({reward(item) for item in group}) > 1


def fill_with_signal(sample_round, group_size: int, groups: int, rounds: int, *,
                     reward=lambda item: item.reward):
  """Dynamic sampling on items: sample_round(r) returns round r's items (`groups` groups
  of `group_size`, group-major; reward(item) is an item's final reward). Rounds run until
  `groups` groups whose rewards are not all equal have been kept, or `rounds` rounds have
  run; a batch still short is then filled with the last round's flat groups. rounds = 1:
  the first round's groups as they came.

  Returns (the batch's items, groups * group_size of them; every item drawn, in order;
  the rounds run).
  """
  kept, drawn = [], []
  for r in range(rounds):
    items = sample_round(r)
    if len(items) != groups * group_size:
      raise ValueError(f"round {r}: {len(items)} items, expected {groups} x {group_size}")
    drawn += items
    if rounds == 1:
      return items, drawn, 1
    flat = []
    for i in range(0, len(items), group_size):
      chunk = items[i:i + group_size]
      (kept if has_signal(chunk, reward) else flat).append(chunk)
    if len(kept) >= groups:
      break
  batch = (kept + flat)[:groups]
  return [item for chunk in batch for item in chunk], drawn, r + 1


def fill_rollouts(sample_round: Callable[[int], tuple[rollout_lib.Rollout, np.ndarray, float]],
                  group_size: int, groups: int, rounds: int
                  ) -> tuple[rollout_lib.Rollout, np.ndarray, float, dict[str, float]]:
  """Dynamic sampling on GRPO rollouts: sample_round(r) -> (round r's Rollout of `groups`
  tasks, scored; its advantages [groups * group_size]; reward seconds). A group has a
  signal when its advantages are not all equal (its rewards, after any shaping, differ).

  Returns (the kept groups as one Rollout, their advantages, the reward seconds of every
  round, metrics). With rounds = 1 the round comes back as it is, with no metrics; else
  the metrics are sample_rounds (rounds run) and sampled_groups_with_signal (the share of
  every drawn group with a signal). The joined Rollout's `seconds` add up the rounds', and
  its reward metrics are the means over the rounds (every completion drawn).
  """
  if rounds == 1:
    ro, adv, reward_s = sample_round(0)
    return ro, adv, reward_s, {}
  made: list[tuple[rollout_lib.Rollout, np.ndarray, float]] = []

  def items(r):
    made.append(sample_round(r))
    return [(r, i) for i in range(len(made[-1][1]))]

  value = lambda item: float(made[item[0]][1][item[1]])
  picked, drawn, ran = fill_with_signal(items, group_size, groups, rounds, reward=value)
  drawn_groups = [drawn[i:i + group_size] for i in range(0, len(drawn), group_size)]
  metrics = {"sample_rounds": float(ran), "sampled_groups_with_signal": float(
      np.mean([has_signal(g, value) for g in drawn_groups]))}
  adv = np.array([value(item) for item in picked], np.float32)
  return (join_groups([m[0] for m in made], picked[::group_size], group_size), adv,
          float(sum(m[2] for m in made)), metrics)


def join_groups(parts: list[rollout_lib.Rollout], firsts: list[tuple[int, int]],
                group_size: int) -> rollout_lib.Rollout:
  """One Rollout of whole groups of scored rollouts: firsts[j] = (part, row of the group's
  first completion) is group j of the result."""
  rows = [(p, r0 + c) for p, r0 in firsts for c in range(group_size)]
  width = max(ro.generation.tokens.shape[1] for ro in parts)
  pad_id = parts[0].tokenizer.pad_id

  def stack(get, fill):
    out = []
    for p, r in rows:
      x = np.asarray(get(parts[p]))[r]
      if x.ndim and x.shape[0] < width:
        x = np.concatenate([x, np.full(width - x.shape[0], fill, x.dtype)])
      out.append(x)
    return np.stack(out)

  gen = Generation(tokens=stack(lambda ro: ro.generation.tokens, pad_id),
                   logprobs=stack(lambda ro: ro.generation.logprobs, 0.0),
                   lengths=stack(lambda ro: ro.generation.lengths, 0),
                   finished=stack(lambda ro: ro.generation.finished, False),
                   prompt_index=np.repeat(np.arange(len(firsts)), group_size))
  task_of = lambda p, r: int(parts[p].generation.prompt_index[r])
  details = [parts[p].reward.details[r] if parts[p].reward.details else None for p, r in rows]
  keys = sorted({k for ro in parts for k in ro.reward.metrics})
  metrics = {k: float(np.mean([ro.reward.metrics[k] for ro in parts if k in ro.reward.metrics]))
             for k in keys}
  reward = rewards.RewardOutput(
      scores=stack(lambda ro: ro.reward.scores, 0.0).astype(np.float32), metrics=metrics,
      details=details if all(d is not None for d in details) else [])
  return rollout_lib.Rollout(
      tasks=[parts[p].tasks[task_of(p, r)] for p, r in firsts],
      prompts=[parts[p].prompts[task_of(p, r)] for p, r in firsts], generation=gen,
      texts=[parts[p].texts[r] for p, r in rows], seconds=float(sum(ro.seconds for ro in parts)),
      tokenizer=parts[0].tokenizer, reward=reward,
      loss_lengths=stack(lambda ro: ro.loss_lengths, 0).astype(np.int32),
      grammar=parts[0].grammar)
