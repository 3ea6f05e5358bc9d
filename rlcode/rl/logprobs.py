"""Token-level log-probabilities, entropies and cross-entropy, shared by SFT and GRPO.

Every place that turns logits into per-token log-probabilities goes through
`token_logprobs` or `token_logprobs_and_entropy`, so the sampler, the update and the
tests agree on one definition (float32, temperature applied before the softmax).

`hidden_logprobs` starts one step earlier, from final hidden states, and with a chunk
size applies the output layer to that many positions at a time inside a scan whose step
is rematerialised: the forward keeps only each chunk's log-probs and entropies, and the
backward recomputes one chunk's logits at a time, so no [rows, tokens, vocab] float32
array exists in either (Qwen2's vocabulary of 152k makes it 0.6 MB a token).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlcode.kernels.spec import cdiv


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
                               temperature: float = 1.0,
                               allow_btw: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(log p(target), entropy of the tempered distribution), both [B, T] float32.

  allow_btw: a grammar's bitmask per position ([B, T, words] int32, bit t % 32 of word
  t // 32 set when token t is allowed; rlcode.engine.grammar): the distribution is the
  masked one the engine sampled from, its disallowed tokens at probability 0."""
  logits = _tempered(logits_btv, temperature)
  if allow_btw is not None:
    allowed = unpack_bits(allow_btw, logits.shape[-1])
    logits = jnp.where(allowed, logits, -jnp.inf)
  picked, logz = _picked_and_logz(logits, targets_bt)
  # A disallowed token (probability 0, logit -inf) adds nothing: 0 * -inf would be nan,
  # forward and backward, so its logit is read as 0 here.
  finite = logits if allow_btw is None else jnp.where(allowed, logits, 0.0)
  entropy = logz - jnp.sum(jax.nn.softmax(logits, axis=-1) * finite, axis=-1)
  return picked - logz, entropy


def unpack_bits(words: jax.Array, vocab_size: int) -> jax.Array:
  """[..., words] int32 bitmask words -> [..., vocab_size] bool (bit t % 32 of word t // 32)."""
  bits = (words[..., None] >> jnp.arange(32, dtype=jnp.int32)) & 1
  return bits.reshape(*words.shape[:-1], -1)[..., :vocab_size].astype(bool)


def cross_entropy(logits_btv: jax.Array, targets_bt: jax.Array,
                  weights_bt: jax.Array | None = None) -> jax.Array:
  """Mean negative log-likelihood over the weighted tokens."""
  nll = -token_logprobs(logits_btv, targets_bt)
  if weights_bt is None:
    return jnp.mean(nll)
  weights_bt = weights_bt.astype(jnp.float32)
  return jnp.sum(nll * weights_bt) / jnp.maximum(jnp.sum(weights_bt), 1.0)


def hidden_logprobs(logits_fn, h_btd: jax.Array, targets_bt: jax.Array,
                    temperature: float = 1.0, chunk: int = 0,
                    allow_btw: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(log p(target), entropy) [B, T] float32 from hidden states [B, T, E].

  logits_fn maps hidden states [B, t, E] to float32 logits [B, t, V] (the model's output
  layer). chunk > 0: it runs on `chunk` positions at a time, each chunk's logits
  recomputed in the backward pass instead of kept; the result equals the unchunked one.
  allow_btw: a grammar's mask per position (token_logprobs_and_entropy).
  """
  b, t = targets_bt.shape
  if not chunk or chunk >= t:
    return token_logprobs_and_entropy(logits_fn(h_btd), targets_bt, temperature, allow_btw)
  n = cdiv(t, chunk)
  pad = n * chunk - t
  # Padding positions allow every token (-1: all bits), so no logsumexp is over nothing.
  padded = lambda x, fill=0: jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2),
                                     constant_values=fill) if pad else x
  chunks = lambda x, fill=0: padded(x, fill).reshape(b, n, chunk, *x.shape[2:]).swapaxes(0, 1)
  xs = (chunks(h_btd), chunks(targets_bt),
        None if allow_btw is None else chunks(allow_btw, -1))

  @jax.checkpoint
  def one(h_c, t_c, a_c):
    return token_logprobs_and_entropy(logits_fn(h_c), t_c, temperature, a_c)

  _, (logp, entropy) = jax.lax.scan(lambda carry, xs: (carry, one(*xs)), None, xs)
  unchunk = lambda x: x.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
  return unchunk(logp), unchunk(entropy)
