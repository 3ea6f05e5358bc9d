"""DAPO's overlong shaping of a GRPO step's samples (Yu et al. 2025, "DAPO").

Two switches, both on the completions the sampler cut at the generation budget L_max
(rl.max_new_tokens; a completion is truncated when it did not end with a stop token):

  filter   (rl.overlong_filter) a truncated completion trains no token: its reward still
           counts in its group's advantages, but its loss mask is 0;
  penalty  (rl.overlong_buffer = L_cache > 0) the soft overlong punishment added to every
           completion's reward before advantages, for a completion of |y| tokens:
             0                                     |y| <= L_max - L_cache
             ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
             -1                                    L_max < |y|
           times rl.overlong_penalty; |y| counts the stop token.

Both apply where the GRPO loop turns rewards into advantages (rlcode.train.grpo_loop's
scoring of a rollout, for batch and partial rollouts alike).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rlcode.rl import rollout as rollout_lib


@dataclasses.dataclass(frozen=True)
class Overlong:
  """max_len: L_max; buffer: L_cache (0: no penalty); factor: the penalty's scale;
  filter: truncated completions train no token."""

  max_len: int
  buffer: int = 0
  factor: float = 1.0
  filter: bool = False

  def __post_init__(self):
    if not 0 <= self.buffer <= self.max_len:
      raise ValueError(f"rl.overlong_buffer={self.buffer} must be in [0, rl.max_new_tokens="
                       f"{self.max_len}]")


  def penalty(self, lengths_n) -> np.ndarray:
    """The soft overlong penalty [N] of completions of lengths_n tokens (0 when off)."""
    lengths = np.asarray(lengths_n, np.float32)
    if not self.buffer:
      return np.zeros_like(lengths)
    over = (lengths - (self.max_len - self.buffer)) / self.buffer
    return (-np.clip(over, 0.0, 1.0) * self.factor).astype(np.float32)

  def apply(self, ro: rollout_lib.Rollout, scores_n) -> np.ndarray:
    """The rewards [N] to take advantages of: scores_n plus the penalty. With `filter`, the
    truncated completions' `loss_lengths` become 0 (set by rollout.score first)."""
    gen = ro.generation
    if self.filter:
      if ro.loss_lengths is None:
        raise ValueError("overlong filtering needs the rollout scored first")
      ro.loss_lengths = np.where(gen.finished, ro.loss_lengths, 0).astype(np.int32)
    return (np.asarray(scores_n, np.float32) + self.penalty(gen.lengths)).astype(np.float32)
