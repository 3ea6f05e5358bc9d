"""The engine's compiled device programs: a forward over paged rows, and per-row sampling.

    forward(state, pools, tokens [R, T], page_table [R, M], lengths [R], valid [R])
        writes the rows' new keys and values through their page tables and returns the
        pools, the logits after each row's last valid token [R, V], and the experts each
        MoE layer chose for each token [R, T, moe layers, top_k] (None for a dense model;
        routing replay's record): one program for chunks of prefill (T a bucket of the
        chunk)
    decode(...)   forward with T = 1 and `sample` fused: the program every step runs
                  (both per model graph: `for_graph`)
    sample(logits [R, V], seed, row, position, temperature, top_k, top_p)

R, T and M are bucketed by the caller (powers of two), so a stream of requests compiles a
handful of programs. The pools are donated: each program updates them in place.

A row's randomness is keyed by (seed, row, position): key(seed), then the completion
position, then the row folded in, as `rlcode.sampling.generation.row_keys` does, so a
sample depends on neither the page size, nor what else is in the batch, nor when it came.

This module must not know about requests, pages or scheduling (rlcode.engine.engine).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlcode.models import moe
from rlcode.models.decoder import Decoder
from rlcode.models.paged import PagedCache
from rlcode.parallel import sharding

# The top log-probabilities returned with each token (OpenAI's `top_logprobs` maximum).
TOP_LOGPROBS = 5


def sample_rows(logits_rv, seed_r, row_r, position_r, temperature_r, top_k_r, top_p_r,
                allow_rw=None):
  """One token per row under per-row parameters, its log-probability under the
  distribution it was drawn from (after the grammar's mask, temperature, top-k, top-p; at
  temperature 0, under the model's own, masked), and that distribution's top
  TOP_LOGPROBS (ids, log-probs). A row's top_k 0 and top_p 1 turn those truncations off,
  exactly as `rlcode.sampling.generation.sample_logits` does for a whole batch.
  `allow_rw`: a grammar bitmask per row (int32 words, bit t % 32 of word t // 32 set
  where token t is allowed; rlcode.engine.grammar), or None."""
  logits_rv = logits_rv.astype(jnp.float32)
  if allow_rw is not None:
    logits_rv = jnp.where(unpack_bits(allow_rw, logits_rv.shape[-1]), logits_rv, -jnp.inf)
  greedy = temperature_r <= 0.0
  scaled = logits_rv / jnp.where(greedy, 1.0, temperature_r)[:, None]
  # Truncation sorts the vocabulary (slow on a CPU): only when some row asks for it.
  truncating = jnp.any(top_k_r > 0) | jnp.any(top_p_r < 1.0)
  scaled = jax.lax.cond(truncating, _truncate, lambda s, k, p: s, scaled, top_k_r, top_p_r)

  def draw(seed, position, row, row_logits):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), position), row)
    return jax.random.categorical(key, row_logits)

  drawn = jax.vmap(draw)(seed_r, position_r, row_r, scaled)
  tok = jnp.where(greedy, jnp.argmax(logits_rv, axis=-1), drawn).astype(jnp.int32)
  logp = jnp.where(greedy[:, None], jax.nn.log_softmax(logits_rv, axis=-1),
                   jax.nn.log_softmax(scaled, axis=-1))
  top_lp, top_ids = jax.lax.top_k(logp, TOP_LOGPROBS)
  return tok, jnp.take_along_axis(logp, tok[:, None], -1)[:, 0], top_ids, top_lp


def unpack_bits(words_rw, vocab_size: int):
  """A bitmask [R, W] int32 as bool [R, vocab_size]."""
  bits = (words_rw[:, :, None] >> jnp.arange(32, dtype=jnp.int32)) & 1
  return bits.reshape(words_rw.shape[0], -1)[:, :vocab_size].astype(bool)


def _truncate(scaled, top_k_r, top_p_r):
  """Top-k, then top-p, per row (0 and 1 leave a row as it is)."""
  desc = jnp.sort(scaled, axis=-1)[:, ::-1]
  use_k = (top_k_r > 0)[:, None]
  kth = jnp.take_along_axis(desc, jnp.clip(top_k_r - 1, 0, desc.shape[-1] - 1)[:, None], -1)
  scaled = jnp.where(use_k & (scaled < kth), -jnp.inf, scaled)
  desc = jnp.where(use_k & (desc < kth), -jnp.inf, desc)
  probs = jax.nn.softmax(desc, axis=-1)
  # Keep the smallest prefix whose mass reaches top_p (the first token always).
  keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p_r[:, None]
  threshold = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
  return jnp.where((top_p_r < 1.0)[:, None] & (scaled < threshold), -jnp.inf, scaled)


def _forward(state, pools, tokens_rt, page_table_rm, lengths_r, valid_r, graphdef, mesh=None):
  if mesh is not None:  # the model's sharding constraints resolve against the engine's mesh
    with sharding.activate(mesh):
      return _forward(state, pools, tokens_rt, page_table_rm, lengths_r, valid_r, graphdef)
  model: Decoder = nnx.merge(graphdef, state)
  k, v = pools
  cache = PagedCache(k=k, v=v, page_table=page_table_rm, lengths=lengths_r, valid=valid_r)
  with moe.collect_experts() as chosen:
    h, cache = model.hidden(tokens_rt, cache=cache)
  last = jnp.take_along_axis(h, jnp.maximum(valid_r - 1, 0)[:, None, None], axis=1)
  return (cache.k, cache.v), model.logits(last)[:, 0], chosen[0] if chosen else None


def _decode(state, pools, tokens_r, page_table_rm, lengths_r, valid_r, seed_r, row_r,
            position_r, temperature_r, top_k_r, top_p_r, allow_rw=None, *, graphdef,
            mesh=None):
  pools, logits, experts = _forward(state, pools, tokens_r[:, None], page_table_rm,
                                    lengths_r, valid_r, graphdef, mesh)
  return (pools, *sample_rows(logits, seed_r, row_r, position_r, temperature_r, top_k_r,
                              top_p_r, allow_rw), experts)


@dataclasses.dataclass(frozen=True)
class Programs:
  """The jitted programs of one model graph (the graph closed over, so a call does not
  hash it again):

    forward(state, pools, tokens [R, T], page_table [R, M], lengths [R], valid [R])
        -> (pools, logits after each row's last valid token [R, V], experts [R, T, moe
            layers, top_k] or None)
    decode(state, pools, tokens [R], page_table, lengths, valid, seed, row, position,
           temperature, top_k, top_p, allow) -> (pools, tokens, log-probs, top ids,
           top log-probs, experts [R, 1, moe layers, top_k] or None); allow a grammar
           bitmask [R, W] or None (a program of its own)
  """

  forward: Callable
  decode: Callable


@functools.lru_cache(maxsize=16)
def for_graph(graphdef, mesh: Mesh | None = None) -> Programs:
  """The programs of `graphdef` (compiled per shape on first use, shared by every engine
  of the same graph and mesh); with a mesh, traced with it active (rlcode.parallel.sharding),
  so heads split over its `tensor` axis."""
  fixed = dict(graphdef=graphdef, mesh=mesh)
  return Programs(
      forward=jax.jit(functools.partial(_forward, **fixed), donate_argnums=(1,)),
      decode=jax.jit(functools.partial(_decode, **fixed), donate_argnums=(1,)))


sample = jax.jit(sample_rows)


def zero_pools(cfg, num_pages: int, page_size: int, mesh: Mesh | None = None):
  """Empty (k, v) pools of every layer; on a mesh, KV heads split over its `tensor` axis
  where that divides them."""
  cache = PagedCache.zeros(cfg, num_pages, page_size)
  pools = (cache.k, cache.v)
  return pools if mesh is None else jax.device_put(pools, pool_sharding(cfg, mesh))


def pool_sharding(cfg, mesh: Mesh) -> NamedSharding:
  """A pool's [pages, KV heads, slots, head dim] on an engine's mesh: heads split over
  `tensor` where that divides them, else replicated."""
  heads = "tensor" if cfg.num_kv_heads % mesh.shape.get("tensor", 1) == 0 else None
  return NamedSharding(mesh, PartitionSpec(None, heads, None, None))


@functools.partial(jax.jit, donate_argnames=("pools",))
def copy_pages(pools, src, dst):
  """The pools with page dst[i] a copy of page src[i] (a shared prompt's last, partial
  page, before the rows that share it write their own tokens into it)."""
  k, v = pools
  return (tuple(x.at[dst].set(x[src]) for x in k), tuple(x.at[dst].set(x[src]) for x in v))
