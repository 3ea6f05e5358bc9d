"""Paged attention in plain XLA: an online softmax over tiles of pages, up to the longest row.

The engine calls this on every decode step off GPU, so its cost follows the
keys in use, not the pool's capacity: a step gathers one tile of pages
([B, pages_per_tile] through the page table) at a time and stops after the
last tile any row can see (a dynamic trip count; the shapes stay static).
Inside a tile the scores are one piece, as decode's direct path.

Must not: gather more than one tile of pages at a time; let an entry at or
beyond a row's length reach the result (the pool holds other rows' data and
scratch there); depend on a backend. Forward only (the loop's trip count is
dynamic): sampling needs no gradient.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from rlcode.kernels import lse as lse_lib
from rlcode.kernels import tiling

F32 = jnp.float32

# Keys per tile when the spec leaves block_k unset. On CPU (B=64, H=14, K=2,
# D=64, 2048 positions in pages of 16, T=1) 64-128 keys ran a step in 1.1-1.9x
# the time of decode's direct path on a dense cache of full rows, and ~2x
# faster than it when rows hold 300 keys; tiles of 2048 keys ran 4-10x slower
# (a gathered tile that leaves the cache).
TILE_KEYS = 128


def key_range(mask: tiling.Mask, q_pos, lengths):
  """Per row, the key positions [lo, hi) its queries q_pos [B, T] may see."""
  hi = lengths
  if mask.causal:
    hi = jnp.minimum(hi, q_pos[:, -1] + 1)
  lo = jnp.zeros_like(hi)
  if mask.window:
    lo = jnp.maximum(lo, q_pos[:, 0] - mask.window + 1)
  return lo, jnp.maximum(hi, lo)


def attention(q, k_pages, v_pages, page_table, mask: tiling.Mask, *, lengths, q_offset,
              pages_per_tile: int, scale=None):
  """q [B, T, H, D] against pages [P, K, S, D] through page_table [B, M]: (out, lse).

  Query t of row b sits at position q_offset[b] + t; keys at j >= lengths[b]
  are never read into the result; `mask` gives causality and the window.
  Returns out [B, T, H, D] in q's dtype and lse [B, T, H] (float32, -inf for
  a query that sees no key, whose out is 0).
  """
  b, t, h, d = q.shape
  _, kh, s, _ = k_pages.shape
  g = h // kh
  c = max(1, min(pages_per_tile, page_table.shape[1]))
  n_tiles = tiling.cdiv(page_table.shape[1], c)
  table = tiling.pad_axis(page_table, 1, n_tiles * c)  # page 0 past the end: masked
  scale = d ** -0.5 if scale is None else scale
  # Rows (group head, query) of one KV head are one matmul operand: [B, K, G * T, D].
  qg = (q.reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, d)
        .astype(F32) * scale)
  q_pos = jnp.asarray(q_offset, jnp.int32).reshape(-1, 1) + jnp.arange(t, dtype=jnp.int32)
  q_pos = jnp.broadcast_to(q_pos, (b, t))
  row_pos = jnp.tile(q_pos, (1, g))[:, None, :, None]  # [B, 1, G * T, 1]
  lo, hi = key_range(mask, q_pos, lengths)
  seen = hi > lo
  first = jnp.min(jnp.where(seen, lo, hi.max())) // (c * s)
  last = tiling.cdiv(jnp.max(jnp.where(seen, hi, 0)), c * s)
  def tile(pool, pages):
    # Gathering from the KV-head-major view gives each head's keys contiguous
    # ([K, B, c * S, D]), so the products below are plain batched matmuls. The
    # swap stays inside the loop, where XLA folds it into the gather; hoisted,
    # it copies the whole pool every call.
    return pool.swapaxes(0, 1)[:, pages].reshape(kh, b, c * s, d).swapaxes(0, 1)

  def body(i, carry):
    m, l, acc = carry
    pages = lax.dynamic_slice_in_dim(table, i * c, c, axis=1)  # [B, c]
    k_pos = i * c * s + jnp.arange(c * s, dtype=jnp.int32)
    valid = k_pos[None] < lengths[:, None]  # [B, c * S]
    vt = jnp.where(valid[:, None, :, None], tile(v_pages, pages), 0).astype(F32)
    scores = jnp.einsum("bkrd,bksd->bkrs", qg, tile(k_pages, pages).astype(F32))
    ok = valid[:, None, None, :]
    if mask.causal:
      ok = ok & (k_pos <= row_pos)
    if mask.window:
      ok = ok & (k_pos > row_pos - mask.window)
    scores = jnp.where(ok, scores, -jnp.inf)
    return lse_lib.online_step(m, l, acc, scores, vt, "bkrs,bksd->bkrd")

  init = (jnp.full((b, kh, g * t), -jnp.inf, F32), jnp.zeros((b, kh, g * t), F32),
          jnp.zeros((b, kh, g * t, d), F32))
  out, lse = lse_lib.online_finish(*lax.fori_loop(first, last, body, init))
  out, lse = out.reshape(b, kh, g, t, d), lse.reshape(b, kh, g, t)
  return (out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype),
          lse.transpose(0, 3, 1, 2).reshape(b, t, h))
