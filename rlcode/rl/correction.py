"""Importance corrections between the policy that sampled a batch and the trainer's.

The sampler records each token's behaviour log-probability (`old_logp` of a batch). The
trainer recomputes the same tokens' log-probabilities under its own weights at the start
of the step (the proximal policy, rlcode.rl.grpo.make_proximal_fn), and the ratio
r = exp(recomputed - behaviour) corrects the loss of the rows it recomputed:

  tis  truncated importance sampling: weight min(r, cap);
  mis  masked importance sampling: weight r where low <= r <= cap, and mask 0 (out of
       the loss and of its aggregation's counts) elsewhere;

at token level (each token's r) or at sequence level (the row's geometric mean of its
token ratios, exp(mean over its trained tokens of (recomputed - behaviour)), for each of
its tokens). The recomputed log-probs become the rows' old log-probs, so the objective's
ratio is taken against the trainer's own policy.

Two corrections use this: the decoupled PPO correction of stale rows (rows sampled some
policy versions behind the trainer: token-level tis with cap rl.max_importance_weight,
on those rows only; `Correction.decoupled`), and the rollout correction
(rl.rollout_correction: every row, whose recomputation under the sampler's own weights
still differs from the sampler's numbers: another kernel, precision or batch shape).
This module computes on arrays only.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

MODES = ("tis", "mis")
LEVELS = ("token", "sequence")


@dataclasses.dataclass(frozen=True)
class Correction:
  """How recomputed rows are corrected (hashable).

  mode: "tis" or "mis"; level: "token" or "sequence"; cap: the upper bound of the ratio
  (tis: truncation, mis: masking); low: the lower bound below which mis masks; every_row:
  recompute and correct every row (the rollout correction) rather than the stale ones.
  """

  mode: str = "tis"
  level: str = "token"
  cap: float = 2.0
  low: float = 0.0
  every_row: bool = False

  def __post_init__(self):
    name = "rl.rollout_correction" if self.every_row else "rl.max_importance_weight"
    if self.mode not in MODES:
      raise ValueError(f"{name}: mode {self.mode!r}; known: {', '.join(MODES)}")
    if self.level not in LEVELS:
      raise ValueError(f"{name}: level {self.level!r}; known: {', '.join(LEVELS)}")
    if not self.cap >= 1.0:
      cap = "rl.rollout_correction_cap" if self.every_row else "rl.max_importance_weight"
      raise ValueError(f"{cap}={self.cap} must be >= 1 (an on-policy token's weight is 1)")
    if not 0.0 <= self.low <= 1.0:
      raise ValueError(f"rl.rollout_correction_low={self.low} must be in [0, 1]")

  @classmethod
  def decoupled(cls, max_weight: float) -> Correction:
    """The decoupled PPO correction of stale rows: token-level tis at max_weight."""
    return cls("tis", "token", float(max_weight), 0.0, every_row=False)


def correct(recomputed_nt, behaviour_nt, mask_nt, rows_n, c: Correction):
  """(weight [N, W], mask [N, W], metrics) of a batch whose rows_n [N] (bool) were
  recomputed; other rows keep weight 1 and their mask.

  metrics, over the batch's trained tokens (mask > 0 on entry):
    iw_clip_frac          the fraction whose weight was truncated (tis);
    iw_mean               the mean weight of those still trained;
    mismatch_kl           the mean k3 estimate of KL(behaviour || recomputed) over the
                          recomputed rows' tokens: r - log r - 1 with r as above;
    mismatch_ratio_max    the largest ratio at the correction's level over those rows;
    mismatch_masked_frac  the fraction masked out (mis).
  Log-ratios are selected by the mask before exp, as in rlcode.rl.objective.
  """
  valid = mask_nt > 0
  sel = rows_n[:, None] & valid
  log_r = jnp.where(sel, recomputed_nt - behaviour_nt, 0.0)
  if c.level == "sequence":
    count = jnp.sum(sel.astype(jnp.float32), 1, keepdims=True)
    level_log_r = jnp.broadcast_to(jnp.sum(log_r, 1, keepdims=True) / jnp.maximum(count, 1.0),
                                   log_r.shape)
  else:
    level_log_r = log_r
  ratio = jnp.exp(level_log_r)
  if c.mode == "tis":
    weight = jnp.where(sel, jnp.minimum(ratio, c.cap), 1.0)
    truncated = sel & (ratio > c.cap)
    masked = jnp.zeros_like(sel)
  else:
    masked = sel & ((ratio < c.low) | (ratio > c.cap))
    weight = jnp.where(sel & ~masked, ratio, jnp.where(masked, 0.0, 1.0))
    truncated = jnp.zeros_like(sel)
  kept = valid & ~masked
  new_mask = jnp.where(masked, 0.0, mask_nt)
  f32 = lambda b: b.astype(jnp.float32)
  trained = jnp.maximum(jnp.sum(f32(valid)), 1.0)
  token_r = jnp.exp(log_r)
  metrics = {
      "iw_clip_frac": jnp.sum(f32(truncated)) / trained,
      "iw_mean": jnp.sum(jnp.where(kept, weight, 0.0)) / jnp.maximum(jnp.sum(f32(kept)), 1.0),
      "mismatch_kl": jnp.sum(jnp.where(sel, token_r - log_r - 1.0, 0.0))
                     / jnp.maximum(jnp.sum(f32(sel)), 1.0),
      "mismatch_ratio_max": jnp.max(jnp.where(sel, ratio, 0.0)),
      "mismatch_masked_frac": jnp.sum(f32(masked)) / trained,
  }
  return weight, new_mask, metrics
