"""Pallas kernels: flash attention forward, backward, and flash-decoding.

Kernel bodies use only generic Pallas (`pl.program_id`, `pl.ds` slices of
refs, jnp/lax ops, `lax.fori_loop`) and 2-D matmuls, so they run in the
interpreter anywhere (`interpret=True`, how the tests run them on CPU) and
lower through Triton on GPU. On GPU we ask for the Triton backend explicitly
(`jax.experimental.pallas.triton.CompilerParams`): since jax 0.10 a bare
`pallas_call` goes to Mosaic GPU, whose pallas_call path needs a different
kernel style (TMA/warpgroup pipelining) than these Triton-style kernels, which
slice whole-sequence refs inside a loop. Triton requires power-of-two tile
sizes and head_dim, and matmul dims of at least 16.

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

from kernels import blockwise, tiling

F32 = jnp.float32
# A finite stand-in for -inf inside kernels: exp(NEG - NEG) stays finite where
# -inf - -inf would be NaN; visibility is tracked by the mask, not by this value.
NEG = -1e30


def _is_pow2(n: int) -> bool:
  return n > 0 and n & (n - 1) == 0


def next_pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def check_gpu_sizes(interpret: bool, **sizes: int) -> None:
  """Triton needs power-of-two tiles and head_dim of at least 16; the interpreter does not.

  Every size named here is a matmul dimension inside a kernel. Below 16 the
  bfloat16 tensor-core path of Triton computes wrong values (seen on an H200
  with a tile of 8 keys: outputs exactly doubled) rather than failing, so it
  is refused here.
  """
  if interpret:
    return
  for name, value in sizes.items():
    if not _is_pow2(value) or value < 16:
      raise ValueError(f"Pallas on GPU (Triton) needs {name}={value} to be a power of two "
                       "of at least 16; use impl='xla' for this shape")


def tile_sizes(bq: int, bk: int, t: int, s: int, interpret: bool) -> tuple[int, int]:
  """Tiles no larger than needed; on GPU powers of two of at least 16 (Triton's dot)."""
  if interpret:
    return blockwise.tile_sizes(bq, bk, t, s)
  return max(16, min(bq, next_pow2(t))), max(16, min(bk, next_pow2(s)))


def call(kernel, *, grid, in_specs, out_specs, out_shape, interpret: bool, name: str,
         num_warps: int = 4, num_stages: int = 2):
  """pl.pallas_call, on the Triton backend when compiled for GPU."""
  params = {}
  if not interpret:
    # Imported only when compiling for GPU: the Triton backend is deprecated
    # from jax 0.11 and the interpreter does not need it.
    from jax.experimental.pallas import triton as pltriton  # pylint: disable=C0415
    params["compiler_params"] = pltriton.CompilerParams(num_warps=num_warps,
                                                        num_stages=num_stages)
  return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                        out_shape=out_shape, interpret=interpret, name=name, **params)


# Matmuls accumulate in float32. HIGHEST keeps float32 inputs in float32 (the
# Triton lowering maps DEFAULT to TF32, ten mantissa bits); bfloat16 inputs are
# unaffected and take the tensor cores as usual.
_HIGHEST = lax.Precision.HIGHEST


def dot_nt(a, b):
  """a [m, k] @ b[n, k]^T in float32."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=_HIGHEST,
                         preferred_element_type=F32)


def dot_nn(a, b):
  """a [m, k] @ b [k, n] in float32."""
  return lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=_HIGHEST,
                         preferred_element_type=F32)


def dot_tn(a, b):
  """a [k, m]^T @ b [k, n] in float32."""
  return lax.dot_general(a, b, (((0,), (0,)), ((), ())), precision=_HIGHEST,
                         preferred_element_type=F32)


# ------------------------------------------------------------------ kernels


def _fwd_kernel(sc_ref, q_ref, k_ref, v_ref, qpos_ref, qseg_ref, kpos_ref, kseg_ref,
                o_ref, lse_ref, *, mask, scale, bk):
  lo, hi, kv_len, final = sc_ref[0], sc_ref[1], sc_ref[2], sc_ref[3]
  q = q_ref[...]
  q_pos, q_seg = qpos_ref[...], qseg_ref[...]
  bq, d = q.shape

  def body(j, carry):
    m, l, acc = carry
    start = pl.multiple_of(j * bk, bk)
    kj, vj = k_ref[pl.ds(start, bk), :], v_ref[pl.ds(start, bk), :]
    ok = tiling.block_mask(mask, q_pos, q_seg, start + lax.iota(jnp.int32, bk),
                           kpos_ref[pl.ds(start, bk)], kseg_ref[pl.ds(start, bk)],
                           kv_len, final)
    s = jnp.where(ok, dot_nt(q, kj) * scale, NEG)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    p = jnp.where(ok, jnp.exp(s - m_new[:, None]), 0.0)
    alpha = jnp.exp(m - m_new)
    l = alpha * l + jnp.sum(p, axis=1)
    acc = alpha[:, None] * acc + dot_nn(p.astype(vj.dtype), vj)
    return m_new, l, acc

  init = (jnp.full((bq,), NEG, F32), jnp.zeros((bq,), F32), jnp.zeros((bq, d), F32))
  m, l, acc = lax.fori_loop(lo, hi, body, init)
  seen = l > 0
  l_safe = jnp.where(seen, l, 1.0)
  o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(seen, m + jnp.log(l_safe), -jnp.inf)


def _dq_kernel(sc_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qpos_ref, qseg_ref,
               kpos_ref, kseg_ref, dq_ref, *, mask, scale, bk):
  lo, hi, kv_len, final = sc_ref[0], sc_ref[1], sc_ref[2], sc_ref[3]
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  lse = jnp.where(lse == -jnp.inf, 0.0, lse)
  q_pos, q_seg = qpos_ref[...], qseg_ref[...]

  def body(j, dq):
    start = pl.multiple_of(j * bk, bk)
    kj, vj = k_ref[pl.ds(start, bk), :], v_ref[pl.ds(start, bk), :]
    ok = tiling.block_mask(mask, q_pos, q_seg, start + lax.iota(jnp.int32, bk),
                           kpos_ref[pl.ds(start, bk)], kseg_ref[pl.ds(start, bk)],
                           kv_len, final)
    p = jnp.where(ok, jnp.exp(dot_nt(q, kj) * scale - lse[:, None]), 0.0)
    ds = p * (dot_nt(do, vj) - delta[:, None])
    return dq + dot_nn(ds.astype(kj.dtype), kj)

  dq = lax.fori_loop(lo, hi, body, jnp.zeros(q.shape, F32))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(sc_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qpos_ref, qseg_ref,
                kpos_ref, kseg_ref, dk_ref, dv_ref, *, mask, scale, bq, groups):
  lo, hi, kv_len, final = sc_ref[0], sc_ref[1], sc_ref[2], sc_ref[3]
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
      p = jnp.where(ok, jnp.exp(dot_nt(qi, kj) * scale - lse[:, None]), 0.0)
      dv = dv + dot_tn(p.astype(doi.dtype), doi)
      ds = p * (dot_nt(doi, vj) - delta[:, None])
      dk = dk + dot_tn(ds.astype(qi.dtype), qi)
      return dk, dv
    return lax.fori_loop(lo, hi, body, carry)

  zeros = jnp.zeros(kj.shape, F32)
  carry = (zeros, zeros)
  for g in range(groups):  # static: Triton indexes refs with constants best
    carry = group(g, carry)
  dk, dv = carry
  dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


# ------------------------------------------------------------------ wrappers


def _scalars(lo, hi, kv_len, final):
  """Per (row, tile) int32 [B, n, 4]: (lo, hi, kv_len, final), read as scalars in kernels."""
  b, n = lo.shape
  return jnp.stack([lo, hi, jnp.broadcast_to(kv_len[:, None], (b, n)),
                    jnp.broadcast_to(final[:, None], (b, n))], axis=-1).astype(jnp.int32)


def _query_ranges(lo, hi, nk: int):
  """For each key tile, the range of query tiles that visit it: [B, nk] twice."""
  nq = lo.shape[1]
  j = jnp.arange(nk)[None, None, :]
  visits = (lo[:, :, None] <= j) & (j < hi[:, :, None])  # [B, nq, nk], tiles only
  any_visit = visits.any(axis=1)
  first = jnp.argmax(visits, axis=1)
  last = nq - jnp.argmax(visits[:, ::-1], axis=1)
  return (jnp.where(any_visit, first, 0).astype(jnp.int32),
          jnp.where(any_visit, last, 0).astype(jnp.int32))


def _forward(q, k, v, lay, mask, scale, bq, bk, interpret):
  """q [B, H, Tp, D], k/v [B, K, Sp, D] -> out [B, H, Tp, D], lse [B, H, Tp]."""
  b, h, tp, d = q.shape
  kh, sp = k.shape[1], k.shape[2]
  g = h // kh
  kernel = functools.partial(_fwd_kernel, mask=mask, scale=scale, bk=bk)
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
  )(_scalars(lay.lo, lay.hi, lay.kv_len, lay.final), q, k, v, lay.q_pos, lay.q_seg,
    lay.k_pos, lay.k_seg)


def _backward(q, k, v, out, lse, dout, dlse, lay, mask, scale, bq, bk, interpret):
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
  )(_scalars(lay.lo, lay.hi, lay.kv_len, lay.final), q, k, v, dout, lse, delta,
    lay.q_pos, lay.q_seg, lay.k_pos, lay.k_seg)

  qlo, qhi = _query_ranges(lay.lo, lay.hi, sp // bk)
  grouped = lambda x: x.reshape(b, kh, g, *x.shape[2:])
  dk, dv = call(
      functools.partial(_dkv_kernel, mask=mask, scale=scale, bq=bq, groups=g),
      grid=(b, kh, sp // bk), interpret=interpret, name="flash_dkv",
      in_specs=[
          pl.BlockSpec((None, None, 4), lambda bi, ki, j: (bi, j, 0)),
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
  )(_scalars(qlo, qhi, lay.kv_len, lay.final), grouped(q), k, v, grouped(dout),
    grouped(lse), grouped(delta), lay.q_pos, lay.q_seg, lay.k_pos, lay.k_seg)
  return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def flash(q, k, v, lay, mask, scale, bq, bk, interpret):
  """Pallas flash attention on head-major padded inputs q [B, H, Tp, D], k/v [B, K, Sp, D].

  Returns (out [B, H, Tp, D], lse [B, H, Tp] float32); gradients by the
  Pallas dQ and dK/dV kernels.
  """
  return _forward(q, k, v, lay, mask, scale, bq, bk, interpret)


def _flash_fwd(q, k, v, lay, mask, scale, bq, bk, interpret):
  out, lse = _forward(q, k, v, lay, mask, scale, bq, bk, interpret)
  return (out, lse), (q, k, v, out, lse, lay)


def _flash_bwd(mask, scale, bq, bk, interpret, res, cts):
  q, k, v, out, lse, lay = res
  dq, dk, dv = _backward(q, k, v, out, lse, cts[0], cts[1], lay, mask, scale, bq, bk,
                         interpret)
  return dq, dk, dv, None


flash.defvjp(_flash_fwd, _flash_bwd)


def masked_flash(q, k, v, mask: tiling.Mask, *, bq: int, bk: int, interpret: bool,
                 scale=None, q_offset=None, kv_lengths=None, segment_ids=None,
                 kv_segment_ids=None, k_pos=None):
  """Pallas attention of q [B, T, H, D] over k, v [B, S, K, D] under `mask`.

  Same contract as `blockwise.masked_flash`: returns (out, lse [B, T, H]).
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
  qh, kh, vh = blockwise.to_head_major(q, k, v, tp, sp)
  qh = qh.reshape(b, h, tp, d)
  out, lse = flash(qh, kh, vh, lay, mask, scale, bq, bk, interpret)
  kvh = k.shape[2]
  return blockwise.from_head_major(out.reshape(b, kvh, h // kvh, tp, d),
                                   lse.reshape(b, kvh, h // kvh, tp), t)


def attention(q, k, v, spec, *, interpret: bool, q_offset=None, kv_lengths=None,
              segment_ids=None, kv_segment_ids=None, scale=None):
  """`kernels.attention` for impl="pallas"/"pallas_interpret": returns (out, lse)."""
  bq, bk = spec.blocks("pallas")
  return masked_flash(q, k, v, tiling.Mask.from_spec(spec), bq=bq, bk=bk,
                      interpret=interpret, scale=scale, q_offset=q_offset,
                      kv_lengths=kv_lengths, segment_ids=segment_ids,
                      kv_segment_ids=kv_segment_ids)


# ------------------------------------------------------------------ decode


def _merge_splits(out, lse, axis: int):
  """Log-sum-exp merge of partial attentions stacked along `axis`."""
  m = jnp.max(lse, axis=axis, keepdims=True)
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  w = jnp.exp(lse - m)
  denom = jnp.sum(w, axis=axis)
  merged = jnp.sum(w[..., None] * out, axis=axis) / jnp.where(denom > 0, denom, 1.0)[..., None]
  lse = jnp.where(denom > 0, jnp.squeeze(m, axis) + jnp.log(jnp.where(denom > 0, denom, 1.0)),
                  -jnp.inf)
  return merged, lse


def decode(q, k, v, mask: tiling.Mask, *, lengths, q_offset, bk: int, interpret: bool,
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
  rp = rows if interpret else max(16, next_pow2(rows))
  bk = min(bk, tiling.round_up(s, 8)) if interpret else max(16, min(bk, next_pow2(s)))
  check_gpu_sizes(interpret, block_k=bk, head_dim=d)
  sp = tiling.round_up(s, bk)
  nk = sp // bk
  if num_splits is None:
    num_splits = max(1, min(16, nk // 4))
  if num_splits < 1:
    raise ValueError(f"decode_attention: num_splits={num_splits} must be positive")
  num_splits = min(num_splits, nk)
  per_split = -(-nk // num_splits)

  # The layout of one query tile holding all Tq queries gives the row's key range.
  lay = tiling.make_layout(mask, b, tq, s, tq, bk, q_offset=q_offset,
                           kv_lengths=lengths)
  lo, hi = lay.lo[:, 0], lay.hi[:, 0]
  split = jnp.arange(num_splits)[None, :]
  s_lo = jnp.clip(lo[:, None], split * per_split, (split + 1) * per_split)
  s_hi = jnp.clip(hi[:, None], s_lo, (split + 1) * per_split)
  sc = _scalars(s_lo, s_hi, lay.kv_len, lay.final)

  # Rows are (t, g) pairs of one KV head; padding rows sit at position -1.
  q_rows = q.reshape(b, tq, kh, g, d).transpose(0, 2, 1, 3, 4).reshape(b, kh, rows, d)
  q_rows = tiling.pad_axis(q_rows, 2, rp)
  row_pos = jnp.repeat(lay.q_pos[:, :tq], g, axis=1)
  row_pos = jnp.concatenate([row_pos, jnp.full((b, rp - rows), -1, jnp.int32)], axis=1)
  row_seg = jnp.zeros((b, rp), jnp.int32)
  kt = tiling.pad_axis(k, 1, sp).transpose(0, 2, 1, 3)
  vt = tiling.pad_axis(v, 1, sp).transpose(0, 2, 1, 3)

  kernel = functools.partial(_fwd_kernel, mask=mask, scale=scale, bk=bk)
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
  out, lse = _merge_splits(out, lse, axis=2)  # [B, K, Rp, D], [B, K, Rp]
  out = out[:, :, :rows].reshape(b, kh, tq, g, d).transpose(0, 2, 1, 3, 4).reshape(b, tq, h, d)
  lse = lse[:, :, :rows].reshape(b, kh, tq, g).transpose(0, 2, 1, 3).reshape(b, tq, h)
  return out.astype(q.dtype), lse
