"""The 1-of-k Plackett-Luce choice loss and the accuracy of a reward model's choices.

A user shown k candidates picks candidate i with probability softmax(r)_i (the first
stage of a Plackett-Luce ranking), so the negative log-likelihood of an observed choice
is -r_chosen + logsumexp(r_1..r_k). At k = 2 this is Bradley-Terry's
-log sigmoid(r_chosen - r_other). Choices may offer different numbers of candidates: a
batch pads them to one width K and `valid` marks the real ones; padding never reaches the
log-sum-exp (it is selected out first, not multiplied by zero afterwards).

This module knows nothing about models or tokens: scores in, a scalar out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _masked(scores_bk, valid_bk):
  return jnp.where(valid_bk > 0, scores_bk.astype(jnp.float32), -jnp.inf)


def choice_nll(scores_bk: jax.Array, chosen_b: jax.Array, valid_bk: jax.Array,
               rows_b: jax.Array | None = None) -> jax.Array:
  """Per choice -r_chosen + logsumexp over the valid candidates, [B]. The chosen candidate
  must be valid. Rows where rows_b is 0 (batch padding) read none of their scores: their
  value is the constant log K and no gradient reaches them."""
  masked = _masked(scores_bk, valid_bk)
  if rows_b is not None:
    masked = jnp.where(rows_b[:, None] > 0, masked, 0.0)
  lse = jax.nn.logsumexp(masked, axis=1)
  picked = jnp.take_along_axis(masked, chosen_b[:, None].astype(jnp.int32), axis=1)[:, 0]
  return lse - picked


def plackett_luce_loss(scores_bk: jax.Array, chosen_b: jax.Array, valid_bk: jax.Array,
                       weight_b: jax.Array | None = None) -> jax.Array:
  """The weighted mean over choices of `choice_nll` (weight 0: a padding row)."""
  if weight_b is None:
    return jnp.mean(choice_nll(scores_bk, chosen_b, valid_bk))
  w = weight_b.astype(jnp.float32)
  nll = choice_nll(scores_bk, chosen_b, valid_bk, rows_b=w)
  return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1e-9)


def bradley_terry_loss(chosen_scores_b: jax.Array, other_scores_b: jax.Array) -> jax.Array:
  """Mean -log sigmoid(r_chosen - r_other) over pairs: the k = 2 case, written pairwise."""
  return -jnp.mean(jax.nn.log_sigmoid(chosen_scores_b - other_scores_b))


def choice_accuracy(scores_bk: jax.Array, chosen_b: jax.Array, valid_bk: jax.Array,
                    weight_b: jax.Array | None = None) -> jax.Array:
  """Weighted share of choices whose highest-scoring valid candidate is the chosen one
  (a tie at the top counts as a miss unless the chosen candidate comes first)."""
  hit = (jnp.argmax(_masked(scores_bk, valid_bk), axis=1) == chosen_b).astype(jnp.float32)
  if weight_b is None:
    return jnp.mean(hit)
  w = weight_b.astype(jnp.float32)
  return jnp.sum(hit * w) / jnp.maximum(jnp.sum(w), 1e-9)
