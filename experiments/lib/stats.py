"""Statistics of the experiment tables: mean and standard error over seeds, paired
differences, the gains of the seed tables with a control, the Wilson interval of a rate,
and the success and signal counts of diff-reward groups."""

from __future__ import annotations

import math

import numpy as np


def mean_se(values, *, se_of_one: float = 0.0) -> tuple[float, float]:
  """Mean and standard error (sample standard deviation / sqrt(n)) of `values`.

  One value has no spread: its standard error is `se_of_one` (0.0; the seed tables of
  grpo/tiny_seeds.py and its kin pass float("nan"), as they always printed).
  """
  values = [float(v) for v in values]
  n = len(values)
  mean = sum(values) / n
  if n < 2:
    return mean, se_of_one
  var = sum((v - mean) ** 2 for v in values) / (n - 1)
  return mean, math.sqrt(var / n)


def paired(after, before, *, se_of_one: float = 0.0) -> tuple[float, float]:
  """mean_se of the per-seed differences after[i] - before[i] (the same seeds, in order)."""
  after, before = list(after), list(before)
  if len(after) != len(before):
    raise ValueError(f"paired: {len(after)} values against {len(before)}")
  return mean_se([a - b for a, b in zip(after, before)], se_of_one=se_of_one)


def seed_gains(val_gains, held_of=None, *, control: bool = False) -> dict:
  """The gains grpo/tiny_seeds.py and agent/tiny_seeds.py report, each (mean, standard
  error) over the seeds, nan the standard error of one seed: "val_gain", of `val_gains`;
  given `held_of` (an arm -> the seeds' held-out scores, in one order),
  "held_out_grpo_gain" (arm "grpo" less "warm_start", paired by seed), and with `control`
  "held_out_ce_gain" ("ce" less "warm_start") and "held_out_grpo_minus_ce"."""
  nan = float("nan")
  gains = {"val_gain": mean_se(val_gains, se_of_one=nan)}
  if held_of is not None:
    gains["held_out_grpo_gain"] = paired(held_of("grpo"), held_of("warm_start"), se_of_one=nan)
    if control:
      gains["held_out_ce_gain"] = paired(held_of("ce"), held_of("warm_start"), se_of_one=nan)
      gains["held_out_grpo_minus_ce"] = paired(held_of("grpo"), held_of("ce"), se_of_one=nan)
  return gains

def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
  """The Wilson score interval of k successes in n trials (95% for the default z)."""
  if n <= 0:
    raise ValueError(f"wilson: n={n} trials")
  if not 0 <= k <= n:
    raise ValueError(f"wilson: k={k} outside [0, n={n}]")
  p = k / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  # At k = 0 (k = n) the lower (upper) end is 0 (1) exactly; rounding would leave ~1e-19.
  lo = 0.0 if k == 0 else max(0.0, centre - half)
  hi = 1.0 if k == n else min(1.0, centre + half)
  return lo, hi


def rate(k: int, n: int) -> dict:
  """k of n with its rate and Wilson interval: {"k", "n", "rate", "lo", "hi"}."""
  lo, hi = wilson(k, n)
  return {"k": int(k), "n": int(n), "rate": k / n, "lo": lo, "hi": hi}


def group_stats(scores_pg: np.ndarray, exact_pg: np.ndarray) -> dict:
  """Success and signal statistics of diff rewards and exact flags [P tasks, G samples]:
  format validity, exact and successful samples (SWE-RL similarity >= the diff reward's
  success threshold), tasks with a success, and groups whose rewards are not all equal
  (the groups that give a GRPO update any signal)."""
  from rlcode.rewards.diffs import FORMAT_ERROR_SCORE, SUCCESS_THRESHOLD
  success = scores_pg >= SUCCESS_THRESHOLD
  p, g = scores_pg.shape
  return {
      "samples": int(p * g),
      "format_valid": float((scores_pg != FORMAT_ERROR_SCORE).mean()),
      "reward_mean": float(scores_pg.mean()),
      "exact": rate(int(exact_pg.sum()), p * g),
      "success": rate(int(success.sum()), p * g),
      "tasks_with_a_success": rate(int(success.any(1).sum()), p),
      "groups_with_signal": rate(int((scores_pg.max(1) > scores_pg.min(1)).sum()), p),
  }
