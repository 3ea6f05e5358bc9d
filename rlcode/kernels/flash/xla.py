"""Masked attention, blockwise (flash-attention style) in plain XLA: the CPU default.

Queries are cut into tiles of block_q and keys into tiles of block_k. Each
query tile visits only its range [lo, hi) of key tiles (`tiling.make_layout`:
the causal bound, the window start, the document start, the valid length),
with an online softmax; tiles outside the range are skipped, not masked. The
backward (`jax.custom_vjp`) recomputes the probabilities from the saved
log-sum-exp, FlashAttention-2 style, over the same tile pairs, accumulating
dK and dV in place. Memory is O(T + S) plus one tile pair: nothing T x S is
ever built, and K/V are never repeated per query head (GQA).

Must not: materialise [T, S]; depend on a backend (it runs anywhere XLA does).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from rlcode.kernels import lse as lse_lib
from rlcode.kernels import tiling, vjp
from rlcode.kernels.spec import AttentionSpec

F32 = jnp.float32


def _tile(x, i, size, axis):
  return lax.dynamic_slice_in_dim(x, i * size, size, axis=axis)


def _key_tile(k, v, lay: tiling.Layout, mask: tiling.Mask, q_pos, q_seg, j, bk):
  """Key tile j in float32 and its visibility [B, 1, 1, bq, bk] from the query tile."""
  k_idx = j * bk + jnp.arange(bk, dtype=jnp.int32)
  ok = tiling.block_mask(mask, q_pos, q_seg, k_idx, _tile(lay.k_pos, j, bk, 0),
                         _tile(lay.k_seg, j, bk, 1), lay.kv_len, lay.final)
  return _tile(k, j, bk, 2).astype(F32), _tile(v, j, bk, 2).astype(F32), ok[:, None, None]


def _forward(q, k, v, lay: tiling.Layout, mask: tiling.Mask, scale: float, bq: int, bk: int):
  """q [B, K, G, Tp, D], k/v [B, K, Sp, D] -> out like q, lse [B, K, G, Tp] f32."""
  b, kh, g, tp, d = q.shape
  lo, hi = jnp.min(lay.lo, axis=0), jnp.max(lay.hi, axis=0)

  def q_tile(i):
    qi = _tile(q, i, bq, 3).astype(F32) * scale
    q_pos, q_seg = _tile(lay.q_pos, i, bq, 1), _tile(lay.q_seg, i, bq, 1)

    def body(j, carry):
      m, l, acc = carry
      kj, vj, ok = _key_tile(k, v, lay, mask, q_pos, q_seg, j, bk)
      s = jnp.where(ok, jnp.einsum("bkgqd,bksd->bkgqs", qi, kj), -jnp.inf)
      return lse_lib.online_step(m, l, acc, s, vj, "bkgqs,bksd->bkgqd")

    init = (jnp.full((b, kh, g, bq), -jnp.inf, F32), jnp.zeros((b, kh, g, bq), F32),
            jnp.zeros((b, kh, g, bq, d), F32))
    out, lse = lse_lib.online_finish(*lax.fori_loop(lo[i], hi[i], body, init))
    return out.astype(q.dtype), lse

  outs, lses = lax.map(q_tile, jnp.arange(tp // bq))
  out = jnp.moveaxis(outs, 0, 3).reshape(b, kh, g, tp, d)
  lse = jnp.moveaxis(lses, 0, 3).reshape(b, kh, g, tp)
  return out, lse


def _backward(q, k, v, lay: tiling.Layout, out, lse, dout, dlse, mask: tiling.Mask,
              scale: float, bq: int, bk: int):
  """Gradients (dq, dk, dv) given cotangents of out and lse."""
  b, kh, g, tp, d = q.shape
  lo, hi = jnp.min(lay.lo, axis=0), jnp.max(lay.hi, axis=0)
  # d lse / d s = p, so the lse cotangent enters as a shift of delta.
  delta = jnp.sum(dout.astype(F32) * out.astype(F32), axis=-1) - dlse.astype(F32)

  def q_tile(carry, i):
    dk, dv = carry
    qi = _tile(q, i, bq, 3).astype(F32) * scale
    doi = _tile(dout, i, bq, 3).astype(F32)
    lse_i, delta_i = _tile(lse, i, bq, 3), _tile(delta, i, bq, 3)
    lse_i = jnp.where(jnp.isfinite(lse_i), lse_i, 0.0)
    q_pos, q_seg = _tile(lay.q_pos, i, bq, 1), _tile(lay.q_seg, i, bq, 1)

    def body(j, c):
      dq, dk, dv = c
      kj, vj, ok = _key_tile(k, v, lay, mask, q_pos, q_seg, j, bk)
      s = jnp.einsum("bkgqd,bksd->bkgqs", qi, kj)
      p = jnp.where(ok, jnp.exp(s - lse_i[..., None]), 0.0)
      dp = jnp.einsum("bkgqd,bksd->bkgqs", doi, vj)
      ds = p * (dp - delta_i[..., None])
      dq = dq + jnp.einsum("bkgqs,bksd->bkgqd", ds, kj)
      dk_j = _tile(dk, j, bk, 2) + jnp.einsum("bkgqs,bkgqd->bksd", ds, qi)
      dv_j = _tile(dv, j, bk, 2) + jnp.einsum("bkgqs,bkgqd->bksd", p, doi)
      dk = lax.dynamic_update_slice_in_dim(dk, dk_j, j * bk, axis=2)
      dv = lax.dynamic_update_slice_in_dim(dv, dv_j, j * bk, axis=2)
      return dq, dk, dv

    dq, dk, dv = lax.fori_loop(lo[i], hi[i], body,
                               (jnp.zeros((b, kh, g, bq, d), F32), dk, dv))
    return (dk, dv), dq * scale

  zeros_kv = jnp.zeros(k.shape, F32)
  (dk, dv), dqs = lax.scan(q_tile, (zeros_kv, zeros_kv), jnp.arange(tp // bq))
  dq = jnp.moveaxis(dqs, 0, 3).reshape(q.shape)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# Blockwise attention on head-major, tile-padded inputs: flash(q, k, v, lay, mask,
# scale, bq, bk) with q [B, K, G, Tp, D], k/v [B, K, Sp, D], lay a `tiling.Layout`,
# returns (out [B, K, G, Tp, D], lse [B, K, G, Tp] float32), differentiable in
# q, k, v (and through lse).
flash = vjp.attention_vjp(_forward, _backward, num_inputs=4)


def masked_flash(q, k, v, mask: tiling.Mask, *, bq: int, bk: int, scale=None, q_offset=None,
                 kv_lengths=None, segment_ids=None, kv_segment_ids=None, k_pos=None):
  """Blockwise attention of q [B, T, H, D] over k, v [B, S, K, D] under `mask`.

  Returns (out [B, T, H, D], lse [B, T, H] float32). k_pos: optional [S]
  ascending key positions (compressed keys); default arange(S).
  """
  b, t, h, d = q.shape
  s = k.shape[1]
  scale = d ** -0.5 if scale is None else float(scale)
  bq, bk = tiling.tile_sizes(bq, bk, t, s)
  lay = tiling.make_layout(mask, b, t, s, bq, bk, q_offset=q_offset, kv_lengths=kv_lengths,
                           segment_ids=segment_ids, kv_segment_ids=kv_segment_ids,
                           k_pos=k_pos)
  qh, kh, vh = tiling.to_head_major(q, k, v, tiling.round_up(t, bq), tiling.round_up(s, bk))
  out, lse = flash(qh, kh, vh, lay, mask, scale, bq, bk)
  return tiling.from_head_major(out, lse, t)


def attention(q, k, v, spec: AttentionSpec, *, q_offset=None, kv_lengths=None,
              segment_ids=None, kv_segment_ids=None, scale=None):
  """`kernels.attention` for impl="xla": returns (out, lse)."""
  bq, bk = spec.blocks("xla")
  return masked_flash(q, k, v, tiling.Mask.from_spec(spec), bq=bq, bk=bk, scale=scale,
                      q_offset=q_offset, kv_lengths=kv_lengths, segment_ids=segment_ids,
                      kv_segment_ids=kv_segment_ids)
