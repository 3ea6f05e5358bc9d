"""Token-level log-probabilities, entropies and cross-entropy, shared by SFT and GRPO.

Every place that turns logits into per-token log-probabilities goes through
`token_logprobs` or `token_logprobs_and_entropy`, so the sampler, the update and the
tests agree on one definition (float32, temperature applied before the softmax).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _tempered(logits_btv: jax.Array, temperature: float) -> jax.Array:
  logits = logits_btv.astype(jnp.float32)
  return logits if temperature == 1.0 else logits / temperature


def _picked_and_logz(logits: jax.Array, targets_bt: jax.Array):
  picked = jnp.take_along_axis(logits, targets_bt[..., None].astype(jnp.int32), -1)[..., 0]
  return picked, jax.nn.logsumexp(logits, axis=-1)


def token_logprobs(logits_btv: jax.Array, targets_bt: jax.Array,
                   temperature: float = 1.0) -> jax.Array:
  """log p(target) [B, T] under softmax(logits / temperature), in float32."""
  picked, logz = _picked_and_logz(_tempered(logits_btv, temperature), targets_bt)
  return picked - logz


def token_logprobs_and_entropy(logits_btv: jax.Array, targets_bt: jax.Array,
                               temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
  """(log p(target), entropy of the tempered distribution), both [B, T] float32."""
  logits = _tempered(logits_btv, temperature)
  picked, logz = _picked_and_logz(logits, targets_bt)
  entropy = logz - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)
  return picked - logz, entropy


def cross_entropy(logits_btv: jax.Array, targets_bt: jax.Array,
                  weights_bt: jax.Array | None = None) -> jax.Array:
  """Mean negative log-likelihood over the weighted tokens."""
  nll = -token_logprobs(logits_btv, targets_bt)
  if weights_bt is None:
    return jnp.mean(nll)
  weights_bt = weights_bt.astype(jnp.float32)
  return jnp.sum(nll * weights_bt) / jnp.maximum(jnp.sum(weights_bt), 1.0)
