"""Paged attention's Pallas kernel: each program walks its row's pages through the page table.

One program per (row, KV head, query block). It reads the row's page indices
from the page table inside the kernel and runs an online softmax over the
pages from the first its queries may see to the last below the row's length
(`kernels.pallas_common`). The G query heads of a KV head and the queries of
the block are the rows of one matmul operand, so GQA reads each page once
per KV head; decode is a block of one query, chunked prefill a block of up
to block_q queries, causal inside. Same interpreter/Triton rules as every
kernel here: on GPU the page size and head_dim are powers of two of at least 16.

Must not: visit a page outside the row's visible range; let a slot at or
beyond the row's length reach the result.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from rlcode.kernels import tiling
from rlcode.kernels.pallas_common import F32, call, check_gpu_sizes, gpu_rows, scalars, softmax_finish, softmax_init, softmax_step


def _kernel(sc_ref, pt_ref, q_ref, qpos_ref, k_ref, v_ref, o_ref, lse_ref, *, mask, scale,
            page_size):
  """Rows q_ref [R, D] at positions qpos_ref [R] over pages [lo, hi) of the row.

  sc_ref holds (first page, end page, the row's length, unused).
  """
  lo, hi, kv_len = sc_ref[0], sc_ref[1], sc_ref[2]
  q, q_pos = q_ref[...], qpos_ref[...]

  def body(j, carry):
    page = pt_ref[j]
    k_pos = j * page_size + lax.iota(jnp.int32, page_size)
    valid = k_pos < kv_len
    kj = k_ref[page, :, :]
    # A masked probability times a NaN slot is still NaN: clear slots past the length.
    vj = jnp.where(valid[:, None], v_ref[page, :, :], 0)
    ok = valid[None, :]
    if mask.causal:
      ok = ok & (k_pos[None, :] <= q_pos[:, None])
    if mask.window:
      ok = ok & (k_pos[None, :] > q_pos[:, None] - mask.window)
    return softmax_step(carry, q, kj, vj, ok, scale)

  softmax_finish(lax.fori_loop(lo, hi, body, softmax_init(*q.shape)), o_ref, lse_ref)


def attention(q, k_pages, v_pages, page_table, mask: tiling.Mask, *, lengths, q_offset,
              bq: int, interpret: bool, scale=None):
  """q [B, T, H, D] against pages [P, K, S, D] through page_table [B, M]: (out, lse).

  bq: queries per block (a chunk of prefill longer than bq takes several
  blocks, one grid column each). Returns out [B, T, H, D] in q's dtype and
  lse [B, T, H] (float32; -inf and out 0 for a query that sees no key).
  """
  b, t, h, d = q.shape
  _, kh, s, _ = k_pages.shape
  g = h // kh
  check_gpu_sizes(interpret, page_size=s, head_dim=d)
  scale = d ** -0.5 if scale is None else float(scale)
  bq = max(1, min(bq, t))
  nq = tiling.cdiv(t, bq)
  tp = nq * bq
  rows = bq * g
  rp = gpu_rows(rows, interpret)

  # Each block's visible key range, from its real queries only.
  q_offset = jnp.broadcast_to(jnp.asarray(q_offset, jnp.int32), (b,))
  starts = jnp.arange(nq, dtype=jnp.int32) * bq
  first_pos = q_offset[:, None] + starts
  last_pos = q_offset[:, None] + jnp.minimum(starts + bq, t) - 1
  hi = jnp.broadcast_to(lengths[:, None], (b, nq))
  if mask.causal:
    hi = jnp.minimum(hi, last_pos + 1)
  lo = jnp.zeros_like(hi)
  if mask.window:
    lo = jnp.maximum(lo, first_pos - mask.window + 1)
  lo_page = lo // s
  hi_page = jnp.maximum(tiling.cdiv(jnp.maximum(hi, 0), s), lo_page)
  sc = scalars(lo_page, hi_page, lengths, jnp.zeros((b,), jnp.int32))

  # Rows of a block are (query, group head) pairs of one KV head; padding sits at -1.
  qb = tiling.pad_axis(q, 1, tp).reshape(b, nq, bq, kh, g, d).transpose(0, 3, 1, 2, 4, 5)
  q_rows = tiling.pad_axis(qb.reshape(b, kh, nq, rows, d), 3, rp)
  pos = q_offset[:, None] + jnp.arange(tp, dtype=jnp.int32)
  pos = jnp.where(jnp.arange(tp) < t, pos, -1).reshape(b, nq, bq)
  row_pos = jnp.repeat(pos, g, axis=2)
  row_pos = jnp.concatenate([row_pos, jnp.full((b, nq, rp - rows), -1, jnp.int32)], axis=2)
  pool = k_pages.shape[0]

  kernel = functools.partial(_kernel, mask=mask, scale=scale, page_size=s)
  out, lse = call(
      kernel, grid=(b, kh, nq), interpret=interpret, name="paged_attention",
      in_specs=[
          pl.BlockSpec((None, None, 4), lambda bi, ki, qi: (bi, qi, 0)),
          pl.BlockSpec((None, page_table.shape[1]), lambda bi, ki, qi: (bi, 0)),
          pl.BlockSpec((None, None, None, rp, d), lambda bi, ki, qi: (bi, ki, qi, 0, 0)),
          pl.BlockSpec((None, None, rp), lambda bi, ki, qi: (bi, qi, 0)),
          pl.BlockSpec((pool, None, s, d), lambda bi, ki, qi: (0, ki, 0, 0)),
          pl.BlockSpec((pool, None, s, d), lambda bi, ki, qi: (0, ki, 0, 0)),
      ],
      out_specs=[pl.BlockSpec((None, None, None, rp, d), lambda bi, ki, qi: (bi, ki, qi, 0, 0)),
                 pl.BlockSpec((None, None, None, rp), lambda bi, ki, qi: (bi, ki, qi, 0))],
      out_shape=[jax.ShapeDtypeStruct((b, kh, nq, rp, d), F32),
                 jax.ShapeDtypeStruct((b, kh, nq, rp), F32)],
  )(sc, page_table, q_rows, row_pos, k_pages, v_pages)
  out = out[:, :, :, :rows].reshape(b, kh, tp, g, d).transpose(0, 2, 1, 3, 4)
  lse = lse[:, :, :, :rows].reshape(b, kh, tp, g).transpose(0, 2, 1, 3)
  return out[:, :t].reshape(b, t, h, d).astype(q.dtype), lse[:, :t].reshape(b, t, h)
