"""Decode attention in plain XLA: one-piece scores while they are small, else blockwise.

A few queries against a cache make a score matrix linear in the cache
length, so up to DIRECT_DECODE_MAX_SCORES it is computed in one piece
(`direct`); longer caches run masked attention's blockwise version over the
key tiles up to the longest row (cost ~ the valid length).

Must not: materialise more than DIRECT_DECODE_MAX_SCORES scores; depend on a backend.
"""

from __future__ import annotations

import jax.numpy as jnp

from rlcode.kernels import tiling
from rlcode.kernels.flash import xla as flash_xla

F32 = jnp.float32

# Decode queries are few, so their whole score matrix [B, H, Tq, S] is linear in
# S: below this many scores it is computed in one piece, which on CPU beats
# tiling (no padding of Tq up to a tile, one matmul pair instead of a loop).
DIRECT_DECODE_MAX_SCORES = 1 << 24


def direct(q, k, v, mask: tiling.Mask, *, lengths, q_offset, scale=None,
           kv_head_major: bool = False):
  """Decode attention in one piece: q [B, Tq, H, D], k/v [B, S, K, D] -> (out, lse).

  With kv_head_major, k/v are [B, K, S, D].

  Query t of row b sits at position q_offset[b] + t; keys at j >= lengths[b]
  are padding; `mask` gives causality and the window. Differentiable by
  plain autodiff (the score matrix is small by construction).
  """
  b, tq, h, d = q.shape
  kv = "bksd" if kv_head_major else "bskd"
  s, kh = (k.shape[2], k.shape[1]) if kv_head_major else (k.shape[1], k.shape[2])
  scale = d ** -0.5 if scale is None else scale
  qg = q.reshape(b, tq, kh, h // kh, d).astype(F32) * scale
  scores = jnp.einsum(f"btkgd,{kv}->bkgts", qg, k.astype(F32))
  q_pos = jnp.asarray(q_offset, jnp.int32).reshape(-1, 1) + jnp.arange(tq, dtype=jnp.int32)
  k_pos = jnp.arange(s, dtype=jnp.int32)
  ok = k_pos[None, None, :] < jnp.asarray(lengths, jnp.int32)[:, None, None]
  if mask.causal:
    ok &= k_pos[None, None, :] <= q_pos[:, :, None]
  if mask.window:
    ok &= k_pos[None, None, :] > q_pos[:, :, None] - mask.window
  scores = jnp.where(ok[:, None, None], scores, -jnp.inf)
  m = jnp.max(scores, axis=-1, keepdims=True)
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  p = jnp.exp(scores - m)
  l = jnp.sum(p, axis=-1, keepdims=True)
  # Probabilities as the left operand ([.., queries, S] x [.., S, D]), so the
  # product is a plain batched matmul; the small result is transposed after.
  out = jnp.einsum(f"bkgts,{kv}->bkgtd", p / jnp.where(l > 0, l, 1.0), v.astype(F32))
  lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)[..., 0]
  return (out.transpose(0, 3, 1, 2, 4).reshape(b, tq, h, d).astype(q.dtype),
          lse.transpose(0, 3, 1, 2).reshape(b, tq, h))


def attention(q, k, v, mask: tiling.Mask, *, lengths, q_offset, bk: int, scale=None,
              kv_head_major: bool = False):
  """`kernels.decode_attention` for impl="xla": returns (out, lse).

  k, v: [B, S, K, D], or [B, K, S, D] with kv_head_major. bk: the key tile
  of the blockwise route.
  """
  b, tq, h, _ = q.shape
  s = k.shape[2] if kv_head_major else k.shape[1]
  if b * h * tq * s <= DIRECT_DECODE_MAX_SCORES:
    return direct(q, k, v, mask, lengths=lengths, q_offset=q_offset, scale=scale,
                  kv_head_major=kv_head_major)
  if kv_head_major:
    k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
  return flash_xla.masked_flash(q, k, v, mask, bq=tiling.round_up(tq, 8), bk=bk, scale=scale,
                                q_offset=q_offset, kv_lengths=lengths)
