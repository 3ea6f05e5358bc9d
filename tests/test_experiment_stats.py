"""The interval, standard-error and gain helpers the experiment tables are built with."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments.lib import tables
from experiments.lib.stats import group_stats, mean_se, seed_gains, wilson


def test_wilson_against_its_closed_forms():
  z = 1.959964
  # No success in n: the upper end is z^2 / (n + z^2), the lower end 0.
  lo, hi = wilson(0, 1000)
  assert lo == 0.0 and hi == pytest.approx(z * z / (1000 + z * z), rel=1e-12)
  # All successes mirror it.
  lo, hi = wilson(1000, 1000)
  assert hi == 1.0 and lo == pytest.approx(1000 / (1000 + z * z), rel=1e-12)
  # Half of n: symmetric about 1/2, half-width z sqrt(1/(4n) + z^2/(4n^2)) / (1 + z^2/n).
  lo, hi = wilson(5, 10)
  half = z * math.sqrt(1 / 40 + z * z / 400) / (1 + z * z / 10)
  assert (lo, hi) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
  assert (round(lo, 4), round(hi, 4)) == (0.2366, 0.7634)  # the textbook value
  with pytest.raises(ValueError, match="n=0"):
    wilson(0, 0)


def test_group_stats_counts_samples_and_groups():
  scores = np.array([[1.0, 0.2, -1.0, 0.95], [0.1, 0.1, 0.1, 0.1], [-1.0] * 4])
  exact = np.array([[True, False, False, False], [False] * 4, [False] * 4])
  s = group_stats(scores, exact)
  assert s["samples"] == 12 and s["format_valid"] == 7 / 12
  assert (s["exact"]["k"], s["exact"]["n"]) == (1, 12)
  assert (s["success"]["k"], s["success"]["n"]) == (2, 12)
  assert (s["tasks_with_a_success"]["k"], s["tasks_with_a_success"]["n"]) == (1, 3)
  # Only the first group's rewards differ.
  assert (s["groups_with_signal"]["k"], s["groups_with_signal"]["n"]) == (1, 3)


def test_mean_se_matches_numpy():
  values = [0.3, 0.5, 0.1]
  mean, se = mean_se(values)
  assert mean == pytest.approx(np.mean(values))
  assert se == pytest.approx(np.std(values, ddof=1) / np.sqrt(3))
  assert mean_se([0.4]) == (0.4, 0.0)


def test_seed_gains_pair_the_arms_by_seed_and_print_a_line_each():
  held = {"warm_start": [0.2, 0.4], "grpo": [0.5, 0.5], "ce": [0.3, 0.6]}
  gains = seed_gains([0.1, 0.3], held.get, control=True)
  assert list(gains) == ["val_gain", "held_out_grpo_gain", "held_out_ce_gain",
                         "held_out_grpo_minus_ce"]
  assert gains["val_gain"] == mean_se([0.1, 0.3])
  assert gains["held_out_grpo_gain"] == mean_se([0.5 - 0.2, 0.5 - 0.4])
  assert gains["held_out_grpo_minus_ce"] == mean_se([0.5 - 0.3, 0.5 - 0.6])
  assert list(seed_gains([0.1, 0.3], held.get)) == ["val_gain", "held_out_grpo_gain"]
  # One seed: no spread, printed as nan, as the seed tables always were.
  one = seed_gains([0.25])
  assert list(one) == ["val_gain"] and math.isnan(one["val_gain"][1])
  assert tables.gains(one, 1) == ("val_gain: +0.250 ± nan (mean ± standard error over 1 "
                                  "seeds)")
