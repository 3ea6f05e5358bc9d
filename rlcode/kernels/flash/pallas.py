"""Masked attention's Pallas kernels: the flash forward and its backward.

Written for the interpreter (CPU tests) and Triton (GPU); the rules they
share with the other families' kernels are in `kernels.pallas_common`.

Each query tile visits only its key-tile range [lo, hi) from
`tiling.make_layout` (skipped, not masked), exactly as the blockwise XLA
version. Backward: Pallas kernels too (FlashAttention-2: a dQ kernel over
query tiles and a dK/dV kernel over key tiles, both recomputing the
probabilities from the saved log-sum-exp), wrapped in `jax.custom_vjp`.

Must not: call backend-specific primitives inside kernel bodies; build [T, S].
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from rlcode.kernels import tiling, vjp
from rlcode.kernels.pallas_common import F32, call, check_gpu_sizes, dot_nn, dot_tn, grad_probs, scalars, softmax_finish, softmax_init, softmax_step, tile_sizes

# ------------------------------------------------------------------ kernels


def _key_tile(j, bk, k_ref, v_ref, kpos_ref, kseg_ref, mask, q_pos, q_seg, kv_len, final):
  """Key tile j (k, v [bk, D]) and its visibility [bq, bk] from the query tile."""
  start = pl.multiple_of(j * bk, bk)
  ok = tiling.block_mask(mask, q_pos, q_seg, start + lax.iota(jnp.int32, bk),
                         kpos_ref[pl.ds(start, bk)], kseg_ref[pl.ds(start, bk)], kv_len, final)
  return k_ref[pl.ds(start, bk), :], v_ref[pl.ds(start, bk), :], ok


def fwd_kernel(sc_ref, q_ref, k_ref, v_ref, qpos_ref, qseg_ref, kpos_ref, kseg_ref,
               o_ref, lse_ref, *, mask, scale, bk):
  """One query tile over its key tiles [lo, hi) (also a split of flash-decoding).

  sc_ref holds (lo, hi, kv_len, final); q_ref [bq, D] with its positions and
  segments; k_ref/v_ref the whole padded key axis with theirs.
  """
  lo, hi, kv_len, final = sc_ref[0], sc_ref[1], sc_ref[2], sc_ref[3]
  q = q_ref[...]
  q_pos, q_seg = qpos_ref[...], qseg_ref[...]

  def body(j, carry):
    kj, vj, ok = _key_tile(j, bk, k_ref, v_ref, kpos_ref, kseg_ref, mask, q_pos, q_seg,
                           kv_len, final)
    return softmax_step(carry, q, kj, vj, ok, scale)

  softmax_finish(lax.fori_loop(lo, hi, body, softmax_init(*q.shape)), o_ref, lse_ref)


def _dq_kernel(sc_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qpos_ref, qseg_ref,
               kpos_ref, kseg_ref, dq_ref, *, mask, scale, bk):
  lo, hi, kv_len, final = sc_ref[0], sc_ref[1], sc_ref[2], sc_ref[3]
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  lse = jnp.where(lse == -jnp.inf, 0.0, lse)
  q_pos, q_seg = qpos_ref[...], qseg_ref[...]

  def body(j, dq):
    kj, vj, ok = _key_tile(j, bk, k_ref, v_ref, kpos_ref, kseg_ref, mask, q_pos, q_seg,
                           kv_len, final)
    _, ds = grad_probs(q, kj, vj, do, lse, delta, ok, scale)
    return dq + dot_nn(ds.astype(kj.dtype), kj)

  dq = lax.fori_loop(lo, hi, body, jnp.zeros(q.shape, F32))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(sc_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qpos_ref, qseg_ref,
                kpos_ref, kseg_ref, dk_ref, dv_ref, *, mask, scale, bq, groups):
  lo, hi, lo2, hi2 = sc_ref[0], sc_ref[1], sc_ref[2], sc_ref[3]
  kv_len, final = sc_ref[4], sc_ref[5]
  kj, vj = k_ref[...], v_ref[...]
  bk = kj.shape[0]
  k_idx = pl.program_id(2) * bk + lax.iota(jnp.int32, bk)
  k_pos, k_seg = kpos_ref[...], kseg_ref[...]

  def group(g, carry):
    def body(i, c):
      dk, dv = c
      start = pl.multiple_of(i * bq, bq)
      qi, doi = q_ref[g, pl.ds(start, bq), :], do_ref[g, pl.ds(start, bq), :]
      lse, delta = lse_ref[g, pl.ds(start, bq)], delta_ref[g, pl.ds(start, bq)]
      lse = jnp.where(lse == -jnp.inf, 0.0, lse)
      ok = tiling.block_mask(mask, qpos_ref[pl.ds(start, bq)], qseg_ref[pl.ds(start, bq)],
                             k_idx, k_pos, k_seg, kv_len, final)
      p, ds = grad_probs(qi, kj, vj, doi, lse, delta, ok, scale)
      dv = dv + dot_tn(p.astype(doi.dtype), doi)
      dk = dk + dot_tn(ds.astype(qi.dtype), qi)
      return dk, dv
    return lax.fori_loop(lo2, hi2, body, lax.fori_loop(lo, hi, body, carry))

  zeros = jnp.zeros(kj.shape, F32)
  carry = (zeros, zeros)
  for g in range(groups):  # static: Triton indexes refs with constants best
    carry = group(g, carry)
  dk, dv = carry
  dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


# ------------------------------------------------------------------ wrappers


def _query_ranges(lo, hi, nk: int):
  """For each key tile, the query tiles that visit it as two ranges: 4 x [B, nk].

  The first range is the first run of visiting tiles; the second runs from the
  next visiting tile to the last. Document masks visit a key tile from its own
  document and again from the final segment (which sees every key): one range
  would walk every document in between, as much work as dense causal. Tiles
  inside a range that do not visit are masked whole, so the ranges need only
  cover every visit.
  """
  nq = lo.shape[1]
  j = jnp.arange(nk)[None, None, :]
  visits = (lo[:, :, None] <= j) & (j < hi[:, :, None])  # [B, nq, nk], tiles only
  any_visit = visits.any(axis=1)
  i = jnp.arange(nq)[None, :, None]
  first = jnp.argmax(visits, axis=1)
  last = nq - jnp.argmax(visits[:, ::-1], axis=1)
  gap = ~visits & (i > first[:, None, :])
  end1 = jnp.where(gap.any(axis=1), jnp.argmax(gap, axis=1), last)
  rest = visits & (i >= end1[:, None, :])
  start2 = jnp.where(rest.any(axis=1), jnp.argmax(rest, axis=1), last)
  zero = lambda x: jnp.where(any_visit, x, 0).astype(jnp.int32)
  return zero(first), zero(end1), zero(start2), zero(last)


def _forward(q, k, v, lay, mask, scale, bq, bk, interpret):
  """q [B, H, Tp, D], k/v [B, K, Sp, D] -> out [B, H, Tp, D], lse [B, H, Tp]."""
  b, h, tp, d = q.shape
  kh, sp = k.shape[1], k.shape[2]
  g = h // kh
  kernel = functools.partial(fwd_kernel, mask=mask, scale=scale, bk=bk)
  return call(
      kernel, grid=(b, h, tp // bq), interpret=interpret, name="flash_fwd",
      in_specs=[
          pl.BlockSpec((None, None, 4), lambda bi, hi, i: (bi, i, 0)),
          pl.BlockSpec((None, None, bq, d), lambda bi, hi, i: (bi, hi, i, 0)),
          pl.BlockSpec((None, None, sp, d), lambda bi, hi, i: (bi, hi // g, 0, 0)),
          pl.BlockSpec((None, None, sp, d), lambda bi, hi, i: (bi, hi // g, 0, 0)),
          pl.BlockSpec((None, bq), lambda bi, hi, i: (bi, i)),
          pl.BlockSpec((None, bq), lambda bi, hi, i: (bi, i)),
          pl.BlockSpec((sp,), lambda bi, hi, i: (0,)),
          pl.BlockSpec((None, sp), lambda bi, hi, i: (bi, 0)),
      ],
      out_specs=[pl.BlockSpec((None, None, bq, d), lambda bi, hi, i: (bi, hi, i, 0)),
                 pl.BlockSpec((None, None, bq), lambda bi, hi, i: (bi, hi, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, tp), F32)],
  )(scalars(lay.lo, lay.hi, lay.kv_len, lay.final), q, k, v, lay.q_pos, lay.q_seg,
    lay.k_pos, lay.k_seg)


def _backward(q, k, v, lay, out, lse, dout, dlse, mask, scale, bq, bk, interpret):
  b, h, tp, d = q.shape
  kh, sp = k.shape[1], k.shape[2]
  g = h // kh
  delta = jnp.sum(dout.astype(F32) * out.astype(F32), axis=-1) - dlse.astype(F32)
  dq = call(
      functools.partial(_dq_kernel, mask=mask, scale=scale, bk=bk),
      grid=(b, h, tp // bq), interpret=interpret, name="flash_dq",
      in_specs=[
          pl.BlockSpec((None, None, 4), lambda bi, hi, i: (bi, i, 0)),
          pl.BlockSpec((None, None, bq, d), lambda bi, hi, i: (bi, hi, i, 0)),
          pl.BlockSpec((None, None, sp, d), lambda bi, hi, i: (bi, hi // g, 0, 0)),
          pl.BlockSpec((None, None, sp, d), lambda bi, hi, i: (bi, hi // g, 0, 0)),
          pl.BlockSpec((None, None, bq, d), lambda bi, hi, i: (bi, hi, i, 0)),
          pl.BlockSpec((None, None, bq), lambda bi, hi, i: (bi, hi, i)),
          pl.BlockSpec((None, None, bq), lambda bi, hi, i: (bi, hi, i)),
          pl.BlockSpec((None, bq), lambda bi, hi, i: (bi, i)),
          pl.BlockSpec((None, bq), lambda bi, hi, i: (bi, i)),
          pl.BlockSpec((sp,), lambda bi, hi, i: (0,)),
          pl.BlockSpec((None, sp), lambda bi, hi, i: (bi, 0)),
      ],
      out_specs=pl.BlockSpec((None, None, bq, d), lambda bi, hi, i: (bi, hi, i, 0)),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
  )(scalars(lay.lo, lay.hi, lay.kv_len, lay.final), q, k, v, dout, lse, delta,
    lay.q_pos, lay.q_seg, lay.k_pos, lay.k_seg)

  ranges = _query_ranges(lay.lo, lay.hi, sp // bk)
  grouped = lambda x: x.reshape(b, kh, g, *x.shape[2:])
  dk, dv = call(
      functools.partial(_dkv_kernel, mask=mask, scale=scale, bq=bq, groups=g),
      grid=(b, kh, sp // bk), interpret=interpret, name="flash_dkv",
      in_specs=[
          pl.BlockSpec((None, None, 6), lambda bi, ki, j: (bi, j, 0)),
          pl.BlockSpec((None, None, g, tp, d), lambda bi, ki, j: (bi, ki, 0, 0, 0)),
          pl.BlockSpec((None, None, bk, d), lambda bi, ki, j: (bi, ki, j, 0)),
          pl.BlockSpec((None, None, bk, d), lambda bi, ki, j: (bi, ki, j, 0)),
          pl.BlockSpec((None, None, g, tp, d), lambda bi, ki, j: (bi, ki, 0, 0, 0)),
          pl.BlockSpec((None, None, g, tp), lambda bi, ki, j: (bi, ki, 0, 0)),
          pl.BlockSpec((None, None, g, tp), lambda bi, ki, j: (bi, ki, 0, 0)),
          pl.BlockSpec((None, tp), lambda bi, ki, j: (bi, 0)),
          pl.BlockSpec((None, tp), lambda bi, ki, j: (bi, 0)),
          pl.BlockSpec((bk,), lambda bi, ki, j: (j,)),
          pl.BlockSpec((None, bk), lambda bi, ki, j: (bi, j)),
      ],
      out_specs=[pl.BlockSpec((None, None, bk, d), lambda bi, ki, j: (bi, ki, j, 0)),
                 pl.BlockSpec((None, None, bk, d), lambda bi, ki, j: (bi, ki, j, 0))],
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                 jax.ShapeDtypeStruct(v.shape, v.dtype)],
  )(scalars(*ranges, lay.kv_len, lay.final), grouped(q), k, v, grouped(dout),
    grouped(lse), grouped(delta), lay.q_pos, lay.q_seg, lay.k_pos, lay.k_seg)
  return dq, dk, dv


# Pallas flash attention on head-major padded inputs: flash(q, k, v, lay, mask,
# scale, bq, bk, interpret) with q [B, H, Tp, D], k/v [B, K, Sp, D], returns
# (out [B, H, Tp, D], lse [B, H, Tp] float32); gradients by the dQ and dK/dV kernels.
flash = vjp.attention_vjp(_forward, _backward, num_inputs=4)


def masked_flash(q, k, v, mask: tiling.Mask, *, bq: int, bk: int, interpret: bool,
                 scale=None, q_offset=None, kv_lengths=None, segment_ids=None,
                 kv_segment_ids=None, k_pos=None):
  """Pallas attention of q [B, T, H, D] over k, v [B, S, K, D] under `mask`.

  Same contract as `kernels.flash.xla.masked_flash`: returns (out, lse [B, T, H]).
  """
  b, t, h, d = q.shape
  s = k.shape[1]
  scale = d ** -0.5 if scale is None else float(scale)
  bq, bk = tile_sizes(bq, bk, t, s, interpret)
  check_gpu_sizes(interpret, block_q=bq, block_k=bk, head_dim=d)
  lay = tiling.make_layout(mask, b, t, s, bq, bk, q_offset=q_offset, kv_lengths=kv_lengths,
                           segment_ids=segment_ids, kv_segment_ids=kv_segment_ids,
                           k_pos=k_pos)
  tp, sp = tiling.round_up(t, bq), tiling.round_up(s, bk)
  qh, kh, vh = tiling.to_head_major(q, k, v, tp, sp)
  qh = qh.reshape(b, h, tp, d)
  out, lse = flash(qh, kh, vh, lay, mask, scale, bq, bk, interpret)
  kvh = k.shape[2]
  return tiling.from_head_major(out.reshape(b, kvh, h // kvh, tp, d),
                                   lse.reshape(b, kvh, h // kvh, tp), t)


def attention(q, k, v, spec, *, interpret: bool, q_offset=None, kv_lengths=None,
              segment_ids=None, kv_segment_ids=None, scale=None):
  """`kernels.attention` for impl="pallas"/"pallas_interpret": returns (out, lse)."""
  bq, bk = spec.blocks("pallas")
  return masked_flash(q, k, v, tiling.Mask.from_spec(spec), bq=bq, bk=bk,
                      interpret=interpret, scale=scale, q_offset=q_offset,
                      kv_lengths=kv_lengths, segment_ids=segment_ids,
                      kv_segment_ids=kv_segment_ids)
