"""Group-relative advantages: each sample's reward against the other samples of its prompt.

Estimators are registered by name (`ADVANTAGES`, chosen by `rl.advantage`): "grpo"
(centred and scaled by the group's standard deviation) and "dr_grpo" (centred only).
Rewards arrive prompt-major, G per group. This module must not know where rewards
come from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
import numpy as np
from rlcode.errors import BadInput, UnknownKey


def _grpo(rewards_n, group_size, eps):
  r = rewards_n.reshape(-1, group_size)
  centred = r - r.mean(axis=1, keepdims=True)
  return (centred / (r.std(axis=1, keepdims=True) + eps)).reshape(-1)


def _dr_grpo(rewards_n, group_size, eps):
  del eps  # Dr.GRPO drops the std scaling, which over-weights near-uniform groups
  r = rewards_n.reshape(-1, group_size)
  return (r - r.mean(axis=1, keepdims=True)).reshape(-1)


ADVANTAGES: dict[str, Callable] = {"grpo": _grpo, "dr_grpo": _dr_grpo}


def group_advantages(rewards_n, group_size: int, estimator: str = "grpo", eps: float = 1e-6,
                     negative_weight: float = 1.0):
  """Advantages [N] for rewards [N] laid out prompt-major in groups of group_size.

  negative_weight scales the negative advantages (samples below their group's mean):
  1.0 is the estimator as published; 0.0 keeps only the positive ones, so the update
  raises the likelihood of a group's better samples and pushes nothing down (the
  "positive sample reinforcement" arm of Zhu et al. 2025, "The Surprising
  Effectiveness of Negative Reinforcement in LLM Reasoning"); values between weigh the
  two halves, as their W-REINFORCE does from the other side."""
  if estimator not in ADVANTAGES:
    raise UnknownKey(f"rl.advantage={estimator!r}; known: {sorted(ADVANTAGES)}")
  if not 0.0 <= negative_weight <= 1.0:
    raise BadInput(f"rl.negative_weight={negative_weight!r}: must be in [0, 1]")
  rewards_n = np.asarray(rewards_n, np.float32)
  if rewards_n.ndim != 1 or rewards_n.shape[0] % group_size:
    raise ValueError(f"{rewards_n.shape[0]} rewards do not split into groups of {group_size}")
  adv = ADVANTAGES[estimator](rewards_n, group_size, eps)
  return np.where(adv < 0, adv * negative_weight, adv).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Advantages:
  """rewards [N] -> advantages [N]: `estimator` over groups of `group_size`, negative
  advantages scaled by `negative_weight`. The settings are checked when it is made, so that
  a trainer that makes it before its warm start fails before it, not at the first step."""

  estimator: str = "grpo"
  group_size: int = 1
  negative_weight: float = 1.0

  def __post_init__(self):
    self(np.zeros(self.group_size))  # raises on a bad setting

  def __call__(self, rewards_n) -> np.ndarray:
    return group_advantages(rewards_n, self.group_size, self.estimator,
                            negative_weight=self.negative_weight)
