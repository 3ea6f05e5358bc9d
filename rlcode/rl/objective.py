"""The policy objective: a surrogate per token, the k3 KL, and their aggregation.

Objectives are registered by name (`OBJECTIVES`, chosen by `rl.objective`): PPO's clipped
token-level surrogate, GSPO's clipped length-normalised sequence ratio and its token-level
variant, and CISPO's REINFORCE with a clipped, stop-gradient importance weight. Each gives
a per-token loss that the rest of `policy_loss` treats alike: the per-token weight, the KL
term, the aggregation and the metrics. Loss aggregations are registered by name
(`AGGREGATIONS`, chosen by `rl.loss_aggregation`): the original GRPO's per-sequence mean,
DAPO's token mean and Dr.GRPO's sum over a constant. `LossConfig` holds the
hyperparameters, hashable so it can be a jit static argument. This module computes on
arrays only: no model, no batch layout.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp


def _seq_mean_token_mean(loss_nt, mask_nt, max_len, totals):
  del max_len  # the original GRPO: each sequence's mean, then the mean over sequences
  per_seq = jnp.sum(loss_nt * mask_nt, 1) / jnp.maximum(jnp.sum(mask_nt, 1), 1.0)
  has = (jnp.sum(mask_nt, 1) > 0).astype(loss_nt.dtype)
  count = jnp.sum(has) if totals is None else totals.sequences
  return jnp.sum(per_seq * has) / jnp.maximum(count, 1.0)


def _token_mean(loss_nt, mask_nt, max_len, totals):
  del max_len  # DAPO: every token of the batch weighs the same
  count = jnp.sum(mask_nt) if totals is None else totals.tokens
  return jnp.sum(loss_nt * mask_nt) / jnp.maximum(count, 1.0)


def _seq_mean_token_sum_norm(loss_nt, mask_nt, max_len, totals):
  # Dr.GRPO: token sums divided by one constant (the generation budget), no
  # per-sequence length normalisation, so long wrong answers are not favoured.
  rows = loss_nt.shape[0] if totals is None else totals.rows
  return jnp.sum(loss_nt * mask_nt) / (rows * max_len)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Totals:
  """A whole batch's counts, for a micro-batch's share of its loss and token means: the
  sequences with a trained token, the trained tokens and the rows (float32 scalars)."""

  sequences: jax.Array
  tokens: jax.Array
  rows: jax.Array

  @classmethod
  def of(cls, mask_nt) -> Totals:
    valid = (mask_nt > 0).astype(jnp.float32)
    return cls(sequences=jnp.sum(jnp.any(mask_nt > 0, axis=1).astype(jnp.float32)),
               tokens=jnp.sum(valid), rows=jnp.float32(mask_nt.shape[0]))


def _per_token(adv):
  """An advantage per row [N] as [N, 1]; one per token [N, W] (rlcode.rl.distill) as it is."""
  return adv[:, None] if adv.ndim == 1 else adv


def _ppo(logp_nt, old_logp_nt, adv_n, valid, cfg):
  # PPO: r = exp(logp - old), min(r * A, clip(r) * A) per token.
  ratio = jnp.exp(jnp.where(valid, logp_nt - old_logp_nt, 0.0))
  adv = _per_token(adv_n)
  clipped = jnp.clip(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
  return jnp.minimum(ratio * adv, clipped * adv), ratio, ratio != clipped


def _sequence_log_ratio(logp_nt, old_logp_nt, valid):
  """[N, 1]: each row's mean log-ratio over its trained tokens (0 for a row with none)."""
  d = jnp.where(valid, logp_nt - old_logp_nt, 0.0)
  count = jnp.sum(valid.astype(jnp.float32), 1, keepdims=True)
  return jnp.sum(d, 1, keepdims=True) / jnp.maximum(count, 1.0)


def _gspo(logp_nt, old_logp_nt, adv_n, valid, cfg):
  # GSPO: s = exp(mean_t(logp - old)) per sequence, min(s * A, clip(s) * A), the
  # sequence's value on each of its tokens.
  s = jnp.exp(_sequence_log_ratio(logp_nt, old_logp_nt, valid))
  adv = _per_token(adv_n)
  clipped = jnp.clip(s, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
  shape = logp_nt.shape
  return (jnp.broadcast_to(jnp.minimum(s * adv, clipped * adv), shape),
          jnp.broadcast_to(s, shape), jnp.broadcast_to(s != clipped, shape))


def _gspo_token(logp_nt, old_logp_nt, adv_n, valid, cfg):
  # GSPO-token: s_t = sg(s) * exp(logp - sg(logp)), whose value is s and whose gradient
  # flows through each token's own log-prob.
  seq = jax.lax.stop_gradient(_sequence_log_ratio(logp_nt, old_logp_nt, valid))
  lp = jnp.where(valid, logp_nt, 0.0)
  s = jnp.exp(seq + (lp - jax.lax.stop_gradient(lp)))
  adv = _per_token(adv_n)
  clipped = jnp.clip(s, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
  return jnp.minimum(s * adv, clipped * adv), s, s != clipped


def _cispo(logp_nt, old_logp_nt, adv_n, valid, cfg):
  # CISPO: sg(clip(r, 1 - eps_low_is, 1 + eps_high_is)) * A * logp per token; no lower
  # bound when cispo_clip_low is None.
  ratio = jnp.exp(jnp.where(valid, logp_nt - old_logp_nt, 0.0))
  low = None if cfg.cispo_clip_low is None else 1.0 - cfg.cispo_clip_low
  w = jnp.clip(ratio, low, 1.0 + cfg.cispo_clip_high)
  surrogate = jax.lax.stop_gradient(w) * _per_token(adv_n) * jnp.where(valid, logp_nt, 0.0)
  return surrogate, ratio, ratio != w


# name -> (logp, old_logp, adv [N] or [N, W], valid, cfg) -> (surrogate [N, W], ratio
# [N, W], clipped [N, W] bool); the per-token loss is -weight * surrogate.
OBJECTIVES: dict[str, Callable] = {
    "ppo": _ppo,
    "gspo": _gspo,
    "gspo_token": _gspo_token,
    "cispo": _cispo,
}

# The update's metrics that are means over trained tokens (`policy_loss`).
TOKEN_MEANS = ("ratio", "clip_frac", "entropy", "kl")

AGGREGATIONS: dict[str, Callable] = {
    "seq_mean_token_mean": _seq_mean_token_mean,
    "token_mean": _token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """The policy-loss hyperparameters (hashable: a jit static argument)."""

  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2
  beta: float = 0.0
  # Log KL(policy || reference) as "kl" even when beta = 0 (the reference
  # log-probs are then computed for the metric only; the loss is unchanged).
  log_kl: bool = False
  aggregation: str = "seq_mean_token_mean"
  max_completion_len: int = 1
  temperature: float = 1.0
  objective: str = "ppo"
  # CISPO's importance weight is clipped to [1 - cispo_clip_low, 1 + cispo_clip_high];
  # None: no lower bound.
  cispo_clip_low: float | None = None
  cispo_clip_high: float = 5.0
  # Routing replay: the update's forward uses the experts the batch recorded
  # (rlcode.rl.grpo); False: it routes, and a batch's record is left unread.
  routing_replay: bool = False

  def __post_init__(self):
    if self.aggregation not in AGGREGATIONS:
      raise KeyError(f"rl.loss_aggregation={self.aggregation!r}; known: {sorted(AGGREGATIONS)}")
    if self.objective not in OBJECTIVES:
      raise KeyError(f"rl.objective={self.objective!r}; known: {sorted(OBJECTIVES)}")

  @property
  def uses_reference(self) -> bool:
    """Whether the update reads reference log-probs (the KL term or its metric)."""
    return self.beta > 0 or self.log_kl


def masked_mean(x_nt, mask_nt, totals: Totals | None = None):
  """Mean of x over the positions where mask is 1; what is elsewhere never reaches the sum.
  With a whole batch's `totals`, a micro-batch's share of the batch's mean."""
  valid = mask_nt > 0
  count = jnp.sum(valid.astype(jnp.float32)) if totals is None else totals.tokens
  return jnp.sum(jnp.where(valid, x_nt, 0.0)) / jnp.maximum(count, 1.0)


def policy_loss(logp_nt, old_logp_nt, adv_n, mask_nt, cfg: LossConfig, ref_logp_nt=None,
                weight_nt=None, totals: Totals | None = None):
  """The objective's surrogate plus beta * KL(policy || reference), aggregated by name.

  adv_n is a row's advantage [N], or each token's [N, W] (on-policy distillation,
  rlcode.rl.distill): A below is then the token's own.
  Per token: -w * surrogate + beta * k3, with w = weight_nt (the importance weight of
  rlcode.rl.correction: a stale row's truncated proximal/behaviour weight or the rollout
  correction's; 1 when not given) and k3 = exp(ref - logp) - (ref - logp) - 1
  (Schulman's unbiased, positive estimator). The surrogate is cfg.objective's
  (`OBJECTIVES`), with r = exp(logp - old_logp) and s = exp(mean over the row's trained
  tokens of (logp - old_logp)):
    ppo         min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A);
    gspo        min(s * A, clip(s, 1 - eps_low, 1 + eps_high) * A), the row's value on
                each of its tokens (GSPO, Zheng et al. 2025);
    gspo_token  the same with s_t = sg(s) * exp(logp - sg(logp)): the value of GSPO, the
                gradient through each token's log-prob;
    cispo       sg(clip(r, 1 - cispo_clip_low, 1 + cispo_clip_high)) * A * logp (CISPO,
                MiniMax-M1): its value is REINFORCE's, not PPO's; its gradient is the
                clipped weight times A times that of logp.
  metrics["ratio"] is the mean over trained tokens of r (gspo, gspo_token: of the row's
  s) and metrics["clip_frac"] the fraction of trained tokens where it lies outside its
  objective's clip range (cispo: its weight is clipped).
  Given reference log-probs, metrics["kl"] is the mean k3, also when beta = 0.
  Log-ratios are selected by the mask before they are exponentiated: whatever sits at
  masked positions (padding, prompt, -inf log-probs) never reaches exp, and inf * 0 never
  makes a NaN. Returns (loss, metrics).

  With `totals` (the whole batch's, rlcode.rl.grpo's micro-batches), the loss and every
  metric are this micro-batch's share: summed over the micro-batches they give the whole
  batch's loss and metrics.
  """
  valid = mask_nt > 0
  mask = valid.astype(jnp.float32)
  surrogate, ratio, clipped = OBJECTIVES[cfg.objective](logp_nt, old_logp_nt, adv_n, valid, cfg)
  if weight_nt is not None:
    surrogate = surrogate * weight_nt
  pg_nt = jnp.where(valid, -surrogate, 0.0)
  aggregate = functools.partial(AGGREGATIONS[cfg.aggregation], mask_nt=mask,
                                max_len=cfg.max_completion_len, totals=totals)
  mean = functools.partial(masked_mean, mask_nt=mask, totals=totals)
  metrics = {"pg_loss": aggregate(pg_nt),
             "clip_frac": mean(clipped.astype(jnp.float32)),
             "ratio": mean(ratio)}
  loss_nt = pg_nt
  if cfg.beta > 0 and ref_logp_nt is None:
    raise ValueError("rl.beta > 0 needs reference log-probabilities")
  if ref_logp_nt is not None:
    d = jnp.where(valid, ref_logp_nt - logp_nt, 0.0)
    kl_nt = jnp.exp(d) - d - 1.0
    if cfg.beta > 0:
      loss_nt = pg_nt + cfg.beta * kl_nt
    metrics["kl"] = mean(kl_nt)
  loss = aggregate(loss_nt)
  metrics["loss"] = loss
  return loss, metrics
