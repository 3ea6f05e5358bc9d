"""The learner's algorithm: what the rl section asks of scoring and of the update, read
in one place.

The rl modules take typed values (objective.LossConfig, advantages.Advantages,
overlong.Overlong, correction.Correction, distill.Distill) and never a config section;
this module is the one that maps the rl section (rlcode.config.rl.RL) and the reward
sections onto them, as Tunix hands each learner its own typed algorithm config. The loops
build an `Algorithm` once, before any model is built, so that a bad setting fails first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlcode import rewards as rewards_lib
from rlcode.rl import advantages as advantages_lib
from rlcode.rl import correction as correction_lib
from rlcode.rl import distill as distill_lib
from rlcode.rl import objective
from rlcode.rl import overlong as overlong_lib
from rlcode.rl import rollout as rollout_lib


def loss(rl, max_completion_len: int) -> objective.LossConfig:
  """The update's loss: objective, clip range, KL, aggregation (over completions of at most
  max_completion_len tokens), temperature and routing replay."""
  return objective.LossConfig(
      clip_eps_low=rl.clip_eps_low, clip_eps_high=rl.clip_eps_high, beta=rl.beta,
      log_kl=bool(rl.log_kl), aggregation=rl.loss_aggregation,
      max_completion_len=max_completion_len, temperature=rl.temperature,
      objective=rl.objective, cispo_clip_low=rl.cispo_clip_low,
      cispo_clip_high=rl.cispo_clip_high,
      routing_replay=bool(getattr(rl, "routing_replay", False)))


def advantages(rl) -> advantages_lib.Advantages:
  """rewards [N] -> advantages [N]: rl.advantage's estimator over groups of rl.group_size,
  negative advantages scaled by rl.negative_weight (checked here, before any step)."""
  return advantages_lib.Advantages(rl.advantage, rl.group_size, float(rl.negative_weight))


def overlong(rl) -> overlong_lib.Overlong:
  """DAPO's overlong shaping at the generation budget rl.max_new_tokens."""
  return overlong_lib.Overlong(max_len=rl.max_new_tokens, buffer=rl.overlong_buffer,
                               factor=float(rl.overlong_penalty),
                               filter=bool(rl.overlong_filter))


def correction(rl) -> correction_lib.Correction:
  """rl.rollout_correction's correction of every row, or with "none" the decoupled one of
  stale rows (capped at rl.max_importance_weight)."""
  if rl.rollout_correction == "none":
    return correction_lib.Correction.decoupled(rl.max_importance_weight)
  return correction_lib.Correction(
      rl.rollout_correction, rl.rollout_correction_level, float(rl.rollout_correction_cap),
      float(rl.rollout_correction_low), every_row=True)


def distill(rl) -> distill_lib.Distill | None:
  """On-policy distillation's weights, or None without rl.distill_teacher."""
  if not rl.distill_teacher:
    return None
  return distill_lib.Distill(coef=float(rl.distill_coef), only=bool(rl.distill_only))


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """A GRPO run's algorithm: how rollouts are scored (rewards, overlong shaping, group
  advantages) and what the update does with them (loss, rollout correction, distillation)."""

  loss: objective.LossConfig
  advantages: advantages_lib.Advantages
  overlong: overlong_lib.Overlong
  correction: correction_lib.Correction
  distill: distill_lib.Distill | None
  reward_weights: Mapping[str, float]
  reward_options: Mapping[str, Mapping[str, Any]]

  @classmethod
  def of(cls, rl, rewards: Mapping[str, float], reward_options) -> Algorithm:
    """The algorithm of an rl section, the rewards' weights and their options section
    (rlcode.rewards.config.RewardOptions), for completions of rl.max_new_tokens."""
    return cls(loss=loss(rl, rl.max_new_tokens), advantages=advantages(rl),
               overlong=overlong(rl), correction=correction(rl), distill=distill(rl),
               reward_weights=dict(rewards),
               reward_options=rewards_lib.options(reward_options))

  def score(self, ro: rollout_lib.Rollout) -> np.ndarray:
    """A rollout's advantages [N]: its completions' rewards (set on the rollout), the
    overlong shaping (the penalty on the rewards, the filter on the trained tokens), then
    the group advantages."""
    reward = rollout_lib.score(ro, self.reward_weights, self.reward_options)
    return self.advantages(self.overlong.apply(ro, reward.scores))
