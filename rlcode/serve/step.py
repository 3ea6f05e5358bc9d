"""The server's compiled device programs: prefill a prompt, place it in a slot, step every slot.

A fixed set of S decode slots shares one KV cache, [S, K, max_seq_len, D] per layer, with
a length per slot (rlcode.models.decoder.KVCache). Three jitted programs, each compiled
once per shape the server can meet:

  prefill(state, tokens [1, T])      T a power of two (bucketed): a few programs, not one
                                     per prompt length. Returns the prompt's last logits
                                     and its per-layer KV.
  insert(cache, kvs, slot, ...)      copies a prefilled prompt's KV into one slot and
                                     samples the slot's first token from the prompt's
                                     logits; the n candidates of a request read one prefill.
  step(state, cache, tokens [S], ...) one token for every slot (free ones compute and are
                                     ignored): the one program the decode loop runs.

Sampling parameters are per slot arrays (temperature, top-p, seed), not static arguments,
so requests with different parameters share the one compiled step. A slot's randomness is
keyed by (seed, candidate, position): a request's samples do not depend on which slots it
got or what else ran beside it.

This module must not know about requests, HTTP or logging (rlcode.serve.engine).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from rlcode.models.decoder import Decoder, KVCache

# The top log-probabilities returned with each token (OpenAI's `top_logprobs` maximum).
TOP_LOGPROBS = 5


def sample_rows(logits_sv, seed_s, candidate_s, position_s, temperature_s, top_p_s):
  """One token per row under per-row parameters, its log-probability under the
  distribution it was drawn from, and the top TOP_LOGPROBS (ids, log-probs) of that
  distribution. Temperature 0 is greedy (log-probs then under the model's softmax)."""
  logits_sv = logits_sv.astype(jnp.float32)
  greedy = temperature_s <= 0.0
  scaled = logits_sv / jnp.where(greedy, 1.0, temperature_s)[:, None]
  desc = jnp.sort(scaled, axis=-1)[:, ::-1]
  probs = jax.nn.softmax(desc, axis=-1)
  # Keep the smallest prefix whose mass reaches top_p (the first token always).
  keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p_s[:, None]
  threshold = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
  truncated = jnp.where((scaled < threshold) & ~greedy[:, None], -jnp.inf, scaled)
  logp = jax.nn.log_softmax(truncated, axis=-1)

  def draw(seed, candidate, position, row_logits):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), candidate), position)
    return jax.random.categorical(key, row_logits)

  drawn = jax.vmap(draw)(seed_s, candidate_s, position_s, truncated)
  tok = jnp.where(greedy, jnp.argmax(logits_sv, axis=-1), drawn).astype(jnp.int32)
  top_lp, top_ids = jax.lax.top_k(logp, TOP_LOGPROBS)
  return tok, jnp.take_along_axis(logp, tok[:, None], -1)[:, 0], top_ids, top_lp


@functools.partial(jax.jit, static_argnames=("graphdef",))
def prefill(state, tokens_1t, length, *, graphdef):
  """The logits after a prompt's last token [1, V] and its per-layer (k, v) [1, T, K, D]."""
  model: Decoder = nnx.merge(graphdef, state)
  h, kvs = model.hidden(tokens_1t)
  last = jax.lax.dynamic_slice_in_dim(h, length - 1, 1, axis=1)
  return model.logits(last)[:, 0], kvs


@functools.partial(jax.jit, donate_argnames=("cache",))
def insert(cache: KVCache, kvs, logits_1v, slot, length, seed, candidate, temperature, top_p):
  """`cache` with a prefilled prompt in `slot` (its length set), and the slot's first
  token sampled from the prompt's logits: (cache, token, log-prob, top ids, top log-probs).
  """
  ks, vs = [], []
  for (k, v), k_cache, v_cache in zip(kvs, cache.k, cache.v):
    size = k_cache.shape[2]
    place = lambda x, c: jax.lax.dynamic_update_slice(
        c, x.swapaxes(1, 2)[:, :, :size].astype(c.dtype), (slot, 0, 0, 0))
    ks.append(place(k, k_cache))
    vs.append(place(v, v_cache))
  lengths = cache.lengths.at[slot].set(length)
  one = lambda x, dtype: jnp.asarray(x, dtype)[None]
  tok, lp, top_ids, top_lp = sample_rows(logits_1v, one(seed, jnp.uint32),
                                         one(candidate, jnp.int32), one(0, jnp.int32),
                                         one(temperature, jnp.float32),
                                         one(top_p, jnp.float32))
  return KVCache(k=tuple(ks), v=tuple(vs), lengths=lengths), tok[0], lp[0], top_ids[0], top_lp[0]


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def step(state, cache: KVCache, tokens_s, active_s, seed_s, candidate_s, position_s,
         temperature_s, top_p_s, *, graphdef):
  """Feeds each slot its last token and samples the next: (cache, tokens, log-probs, top
  ids, top log-probs). Free slots (active false) keep length 0: what they compute is never
  read, and they never write past the cache."""
  model: Decoder = nnx.merge(graphdef, state)
  h, cache = model.hidden(tokens_s[:, None], cache=cache)
  tok, lp, top_ids, top_lp = sample_rows(model.logits(h)[:, 0], seed_s, candidate_s,
                                         position_s, temperature_s, top_p_s)
  cache = KVCache(k=cache.k, v=cache.v, lengths=jnp.where(active_s, cache.lengths, 0))
  return cache, tok, lp, top_ids, top_lp


def empty_cache(cfg, slots: int) -> KVCache:
  """The slots' cache: every slot free."""
  return KVCache.zeros(cfg, slots, cfg.max_seq_len)
