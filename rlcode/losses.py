"""Token-level log-probabilities and cross-entropy, shared by SFT and GRPO."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_logprobs(logits_btv: jax.Array, targets_bt: jax.Array,
                   temperature: float = 1.0) -> jax.Array:
  """log p(target) [B, T] under softmax(logits / temperature), in float32."""
  logits = logits_btv.astype(jnp.float32)
  if temperature != 1.0:
    logits = logits / temperature
  logz = jax.nn.logsumexp(logits, axis=-1)
  picked = jnp.take_along_axis(logits, targets_bt[..., None].astype(jnp.int32), -1)[..., 0]
  return picked - logz


def cross_entropy(logits_btv: jax.Array, targets_bt: jax.Array,
                  weights_bt: jax.Array | None = None) -> jax.Array:
  """Mean negative log-likelihood over the weighted tokens."""
  nll = -token_logprobs(logits_btv, targets_bt)
  if weights_bt is None:
    return jnp.mean(nll)
  weights_bt = weights_bt.astype(jnp.float32)
  return jnp.sum(nll * weights_bt) / jnp.maximum(jnp.sum(weights_bt), 1.0)
