"""NSA's Pallas kernels: the selected branch, forward and backward.

Forward and dQ: one program per query and KV group (as in the paper): its G
heads share the n gathered blocks of l' keys, read by index from the whole
key axis. dK/dV: one program per KV group and key block, which visits the
queries that selected that block. Those lists are the selection inverted in
XLA (a stable sort of the (query, slot) pairs by block), so every gathered
block's gradient is accumulated in one program, without a scatter. Both
recompute the probabilities from the saved log-sum-exp (FlashAttention-2).
Same interpreter/Triton rules as every kernel here (`kernels.pallas_common`).

Must not: call backend-specific primitives inside kernel bodies; build [T, T].
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from rlcode.kernels import tiling, vjp
from rlcode.kernels.pallas_common import F32, call, check_gpu_sizes, dot_nn, dot_tn, gpu_rows, grad_probs, softmax_finish, softmax_init, softmax_step


def _selected_block(idx_ref, j, k_ref, v_ref, t, block: int, s: int):
  """Slot j's key block (k, v [l', D]) and its visibility [1, l'] from query t."""
  blk = idx_ref[j]
  start = pl.multiple_of(jnp.maximum(blk, 0) * block, block)
  kpos = start + lax.iota(jnp.int32, block)
  ok = ((blk >= 0) & (kpos <= t) & (kpos < s))[None, :]
  return k_ref[pl.ds(start, block), :], v_ref[pl.ds(start, block), :], ok


def _fwd_kernel(idx_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, block, num_sel, s, scale):
  t = pl.program_id(2)
  q = q_ref[...]

  def body(j, carry):
    kj, vj, ok = _selected_block(idx_ref, j, k_ref, v_ref, t, block, s)
    return softmax_step(carry, q, kj, vj, ok, scale)

  softmax_finish(lax.fori_loop(0, num_sel, body, softmax_init(*q.shape)), o_ref, lse_ref)


def _dq_kernel(idx_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, block,
               num_sel, s, scale):
  t = pl.program_id(2)
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  lse = jnp.where(lse == -jnp.inf, 0.0, lse)

  def body(j, dq):
    kj, vj, ok = _selected_block(idx_ref, j, k_ref, v_ref, t, block, s)
    _, ds = grad_probs(q, kj, vj, do, lse, delta, ok, scale)
    return dq + dot_nn(ds.astype(kj.dtype), kj)

  dq = lax.fori_loop(0, num_sel, body, jnp.zeros(q.shape, F32))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(range_ref, queries_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
                dk_ref, dv_ref, *, rows, s, scale):
  kj, vj = k_ref[...], v_ref[...]
  block = kj.shape[0]
  kpos = pl.program_id(2) * block + lax.iota(jnp.int32, block)

  def body(i, carry):
    dk, dv = carry
    t = queries_ref[i]
    r0 = pl.multiple_of(t * rows, rows)
    qi, doi = q_ref[pl.ds(r0, rows), :], do_ref[pl.ds(r0, rows), :]
    lse, delta = lse_ref[pl.ds(r0, rows)], delta_ref[pl.ds(r0, rows)]
    lse = jnp.where(lse == -jnp.inf, 0.0, lse)
    ok = ((kpos <= t) & (kpos < s))[None, :]
    p, ds = grad_probs(qi, kj, vj, doi, lse, delta, ok, scale)
    return dk + dot_tn(ds.astype(qi.dtype), qi), dv + dot_tn(p.astype(doi.dtype), doi)

  zeros = jnp.zeros(kj.shape, F32)
  dk, dv = lax.fori_loop(range_ref[0], range_ref[1], body, (zeros, zeros))
  dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _grouped(x, kh: int, rows: int):
  """[B, T, H, ...] -> [B, K, T, rows, ...]: each KV group's heads as rows, padded."""
  b, t, h = x.shape[:3]
  x = x.reshape(b, t, kh, h // kh, *x.shape[3:])
  return tiling.pad_axis(jnp.moveaxis(x, 2, 1), 3, rows)


def _ungrouped(x, h: int):
  """Inverse of `_grouped` (padding rows dropped): [B, T, H, ...]."""
  b, kh, t = x.shape[:3]
  x = jnp.moveaxis(x[:, :, :, :h // kh], 1, 2)
  return x.reshape(b, t, h, *x.shape[4:])


def _keys(x, nb: int, block: int):
  """[B, S, K, D] -> [B, K, nb * l', D]: padded to whole blocks, head-major."""
  return tiling.pad_axis(x, 1, nb * block).transpose(0, 2, 1, 3)


def _sizes(q, k, block: int, interpret: bool):
  b, t, h, d = q.shape
  s, kh = k.shape[1], k.shape[2]
  check_gpu_sizes(interpret, block_sel=block, head_dim=d)
  # Triton's matmul needs at least 16 rows, so the G heads are padded on GPU.
  return b, t, h, d, s, kh, gpu_rows(h // kh, interpret), tiling.cdiv(s, block)


def _forward(q, k, v, idx, block, scale, interpret):
  b, t, h, d, s, kh, rows, nb = _sizes(q, k, block, interpret)
  n = idx.shape[-1]
  kernel = functools.partial(_fwd_kernel, block=block, num_sel=n, s=s, scale=scale)
  out, lse = call(
      kernel, grid=(b, kh, t), interpret=interpret, name="nsa_selected",
      in_specs=[
          pl.BlockSpec((None, None, None, n), lambda bi, ki, ti: (bi, ki, ti, 0)),
          pl.BlockSpec((None, None, None, rows, d), lambda bi, ki, ti: (bi, ki, ti, 0, 0)),
          pl.BlockSpec((None, None, nb * block, d), lambda bi, ki, ti: (bi, ki, 0, 0)),
          pl.BlockSpec((None, None, nb * block, d), lambda bi, ki, ti: (bi, ki, 0, 0)),
      ],
      out_specs=[pl.BlockSpec((None, None, None, rows, d), lambda bi, ki, ti: (bi, ki, ti, 0, 0)),
                 pl.BlockSpec((None, None, None, rows), lambda bi, ki, ti: (bi, ki, ti, 0))],
      out_shape=[jax.ShapeDtypeStruct((b, kh, t, rows, d), q.dtype),
                 jax.ShapeDtypeStruct((b, kh, t, rows), F32)],
  )(idx.transpose(0, 2, 1, 3), _grouped(q, kh, rows), _keys(k, nb, block), _keys(v, nb, block))
  return _ungrouped(out, h), _ungrouped(lse, h)


def block_queries(idx, nb: int):
  """The selection inverted: which queries chose each key block.

  idx [B, K, T, n] (-1 = none). Returns queries [B, K, T * n] (the query of
  each (query, slot) pair, grouped by block, ascending within a block; pairs
  without a block last) and ranges [B, K, nb, 2]: block j's queries are
  queries[ranges[j, 0]:ranges[j, 1]].
  """
  b, kh, t, n = idx.shape
  blocks = jnp.where(idx >= 0, idx, nb).reshape(b, kh, t * n)
  order = jnp.argsort(blocks, axis=-1, stable=True)
  sorted_blocks = jnp.take_along_axis(blocks, order, axis=-1)
  edges = jax.vmap(jax.vmap(lambda row: jnp.searchsorted(
      row, jnp.arange(nb + 1), side="left")))(sorted_blocks)
  ranges = jnp.stack([edges[..., :-1], edges[..., 1:]], axis=-1)
  return (order // n).astype(jnp.int32), ranges.astype(jnp.int32)


def _backward(q, k, v, idx, out, lse, dout, dlse, block, scale, interpret):
  b, t, h, d, s, kh, rows, nb = _sizes(q, k, block, interpret)
  n = idx.shape[-1]
  delta = jnp.sum(dout.astype(F32) * out.astype(F32), axis=-1) - dlse.astype(F32)
  qg, dog = _grouped(q, kh, rows), _grouped(dout, kh, rows)
  lse_g, delta_g = _grouped(lse, kh, rows), _grouped(delta, kh, rows)
  kt, vt = _keys(k, nb, block), _keys(v, nb, block)
  it = idx.transpose(0, 2, 1, 3)  # [B, K, T, n]
  row = lambda *tail: pl.BlockSpec((None, None, None, *tail),
                                   lambda bi, ki, ti: (bi, ki, ti) + (0,) * len(tail))
  whole_keys = pl.BlockSpec((None, None, nb * block, d), lambda bi, ki, ti: (bi, ki, 0, 0))
  dq = call(
      functools.partial(_dq_kernel, block=block, num_sel=n, s=s, scale=scale),
      grid=(b, kh, t), interpret=interpret, name="nsa_selected_dq",
      in_specs=[row(n), row(rows, d), whole_keys, whole_keys, row(rows, d), row(rows),
                row(rows)],
      out_specs=row(rows, d),
      out_shape=jax.ShapeDtypeStruct(qg.shape, q.dtype),
  )(it, qg, kt, vt, dog, lse_g, delta_g)

  queries, ranges = block_queries(it, nb)
  flat = lambda x: x.reshape(b, kh, t * rows, *x.shape[4:])
  whole = lambda *tail: pl.BlockSpec((None, None, *tail),
                                     lambda bi, ki, j: (bi, ki) + (0,) * len(tail))
  key_block = pl.BlockSpec((None, None, block, d), lambda bi, ki, j: (bi, ki, j, 0))
  dk, dv = call(
      functools.partial(_dkv_kernel, rows=rows, s=s, scale=scale),
      grid=(b, kh, nb), interpret=interpret, name="nsa_selected_dkv",
      in_specs=[pl.BlockSpec((None, None, None, 2), lambda bi, ki, j: (bi, ki, j, 0)),
                whole(t * n), whole(t * rows, d), key_block, key_block, whole(t * rows, d),
                whole(t * rows), whole(t * rows)],
      out_specs=[key_block, key_block],
      out_shape=[jax.ShapeDtypeStruct(kt.shape, k.dtype),
                 jax.ShapeDtypeStruct(vt.shape, v.dtype)],
  )(ranges, queries, flat(qg), kt, vt, flat(dog), flat(lse_g), flat(delta_g))
  unkeys = lambda x: x.transpose(0, 2, 1, 3)[:, :s]
  return _ungrouped(dq, h), unkeys(dk), unkeys(dv)


# The selected branch: selected(q, k, v, idx, block, scale, interpret) with
# q [B, T, H, D], k/v [B, T, K, D], idx [B, T, K, n]; returns (out [B, T, H, D],
# lse [B, T, H] float32); gradients by the dQ and dK/dV kernels.
selected = vjp.attention_vjp(_forward, _backward, num_inputs=4)
