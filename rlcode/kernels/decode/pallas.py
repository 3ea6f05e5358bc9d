"""Decode attention's Pallas kernel: flash-decoding (the cache split along the keys).

Each split runs masked attention's forward kernel (`kernels.flash.pallas`)
over its part of the key tiles, one grid column each, and the parts merge by
log-sum-exp (`kernels.lse`). Same interpreter/Triton rules as every kernel
here (`kernels.pallas_common`).

Must not: visit key tiles beyond a row's valid length or outside its window.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from rlcode.kernels import lse as lse_lib
from rlcode.kernels import tiling
from rlcode.kernels.flash import pallas as flash_pallas
from rlcode.kernels.pallas_common import F32, call, check_gpu_sizes, gpu_rows, scalars, tile_sizes


def attention(q, k, v, mask: tiling.Mask, *, lengths, q_offset, bk: int, interpret: bool,
              scale=None, num_splits: int | None = None):
  """Flash-decoding: a few queries q [B, Tq, H, D] against caches k, v [B, S, K, D].

  The cache is split along the keys into `num_splits` parts, one grid column
  each; every part visits only its key tiles inside the visible range of its
  row (the valid length, the window), then the partial (out, lse) are merged
  by log-sum-exp. The queries of one KV group (Tq x G rows) share each key
  tile, so GQA costs one pass over the cache per KV head.

  Returns (out [B, Tq, H, D], lse [B, Tq, H]).
  """
  b, tq, h, d = q.shape
  s, kh = k.shape[1], k.shape[2]
  g = h // kh
  scale = d ** -0.5 if scale is None else float(scale)
  rows = tq * g
  rp = gpu_rows(rows, interpret)
  bk = tile_sizes(bk, bk, s, s, interpret)[1]
  check_gpu_sizes(interpret, block_k=bk, head_dim=d)
  sp = tiling.round_up(s, bk)
  nk = sp // bk
  if num_splits is None:
    num_splits = max(1, min(16, nk // 4))
  if num_splits < 1:
    raise ValueError(f"decode_attention: num_splits={num_splits} must be positive")
  num_splits = min(num_splits, nk)
  per_split = tiling.cdiv(nk, num_splits)

  # The layout of one query tile holding all Tq queries gives the row's key range.
  lay = tiling.make_layout(mask, b, tq, s, tq, bk, q_offset=q_offset,
                           kv_lengths=lengths)
  lo, hi = lay.lo[:, 0], lay.hi[:, 0]
  split = jnp.arange(num_splits)[None, :]
  s_lo = jnp.clip(lo[:, None], split * per_split, (split + 1) * per_split)
  s_hi = jnp.clip(hi[:, None], s_lo, (split + 1) * per_split)
  sc = scalars(s_lo, s_hi, lay.kv_len, lay.final)

  # Rows are (t, g) pairs of one KV head; padding rows sit at position -1.
  q_rows = q.reshape(b, tq, kh, g, d).transpose(0, 2, 1, 3, 4).reshape(b, kh, rows, d)
  q_rows = tiling.pad_axis(q_rows, 2, rp)
  row_pos = jnp.repeat(lay.q_pos[:, :tq], g, axis=1)
  row_pos = jnp.concatenate([row_pos, jnp.full((b, rp - rows), -1, jnp.int32)], axis=1)
  row_seg = jnp.zeros((b, rp), jnp.int32)
  kt = tiling.pad_axis(k, 1, sp).transpose(0, 2, 1, 3)
  vt = tiling.pad_axis(v, 1, sp).transpose(0, 2, 1, 3)

  kernel = functools.partial(flash_pallas.fwd_kernel, mask=mask, scale=scale, bk=bk)
  out, lse = call(
      kernel, grid=(b, kh, num_splits), interpret=interpret, name="flash_decode",
      in_specs=[
          pl.BlockSpec((None, None, 4), lambda bi, ki, si: (bi, si, 0)),
          pl.BlockSpec((None, None, rp, d), lambda bi, ki, si: (bi, ki, 0, 0)),
          pl.BlockSpec((None, None, sp, d), lambda bi, ki, si: (bi, ki, 0, 0)),
          pl.BlockSpec((None, None, sp, d), lambda bi, ki, si: (bi, ki, 0, 0)),
          pl.BlockSpec((None, rp), lambda bi, ki, si: (bi, 0)),
          pl.BlockSpec((None, rp), lambda bi, ki, si: (bi, 0)),
          pl.BlockSpec((sp,), lambda bi, ki, si: (0,)),
          pl.BlockSpec((None, sp), lambda bi, ki, si: (bi, 0)),
      ],
      out_specs=[pl.BlockSpec((None, None, None, rp, d), lambda bi, ki, si: (bi, ki, si, 0, 0)),
                 pl.BlockSpec((None, None, None, rp), lambda bi, ki, si: (bi, ki, si, 0))],
      out_shape=[jax.ShapeDtypeStruct((b, kh, num_splits, rp, d), F32),
                 jax.ShapeDtypeStruct((b, kh, num_splits, rp), F32)],
  )(sc, q_rows, kt, vt, row_pos, row_seg, lay.k_pos, lay.k_seg)
  out, lse = lse_lib.merge_axis(out, lse, axis=2)  # [B, K, Rp, D], [B, K, Rp]
  out = out[:, :, :rows].reshape(b, kh, tq, g, d).transpose(0, 2, 1, 3, 4).reshape(b, tq, h, d)
  lse = lse[:, :, :rows].reshape(b, kh, tq, g).transpose(0, 2, 1, 3).reshape(b, tq, h)
  return out.astype(q.dtype), lse
