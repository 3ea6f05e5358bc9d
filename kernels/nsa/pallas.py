"""NSA's Pallas kernels: the selected branch.

One program per query and KV group (as in the paper): its G heads share the
n gathered blocks of l' keys, read by index from the whole key axis. The
backward is the blockwise XLA one (`kernels.nsa.xla.backward`). Same
interpreter/Triton rules as every kernel here (`kernels.pallas_common`).

Must not: call backend-specific primitives inside kernel bodies; build [T, T].
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import tiling
from kernels.nsa import xla as nsa_xla
from kernels.pallas_common import (F32, call, check_gpu_sizes, gpu_rows, softmax_finish,
                                   softmax_init, softmax_step)


def _sel_kernel(idx_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, block, num_sel, s, scale):
  t = pl.program_id(2)
  q = q_ref[...]

  def body(j, carry):
    blk = idx_ref[j]
    start = pl.multiple_of(jnp.maximum(blk, 0) * block, block)
    kj, vj = k_ref[pl.ds(start, block), :], v_ref[pl.ds(start, block), :]
    kpos = start + lax.iota(jnp.int32, block)
    ok = ((blk >= 0) & (kpos <= t) & (kpos < s))[None, :]
    return softmax_step(carry, q, kj, vj, ok, scale)

  softmax_finish(lax.fori_loop(0, num_sel, body, softmax_init(*q.shape)), o_ref, lse_ref)


def _forward(q, k, v, idx, block, scale, interpret):
  b, t, h, d = q.shape
  s, kh = k.shape[1], k.shape[2]
  g = h // kh
  n = idx.shape[-1]
  check_gpu_sizes(interpret, block_sel=block, head_dim=d)
  # One program per (query, KV group): its G heads share the gathered blocks.
  # Triton's matmul needs at least 16 rows, so pad the heads on GPU.
  rows = gpu_rows(g, interpret)
  nb = tiling.cdiv(s, block)
  qg = q.reshape(b, t, kh, g, d).transpose(0, 2, 1, 3, 4)
  qg = tiling.pad_axis(qg, 3, rows)
  kt = tiling.pad_axis(k, 1, nb * block).transpose(0, 2, 1, 3)
  vt = tiling.pad_axis(v, 1, nb * block).transpose(0, 2, 1, 3)
  it = idx.transpose(0, 2, 1, 3)  # [B, K, T, n]
  kernel = functools.partial(_sel_kernel, block=block, num_sel=n, s=s, scale=scale)
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
  )(it, qg, kt, vt)
  out = out[:, :, :, :g].transpose(0, 2, 1, 3, 4).reshape(b, t, h, d)
  lse = lse[:, :, :, :g].transpose(0, 2, 1, 3).reshape(b, t, h)
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def selected(q, k, v, idx, block: int, bq: int, scale: float, interpret: bool):
  """The selected branch: q [B, T, H, D], k/v [B, T, K, D], idx [B, T, K, n].

  Returns (out [B, T, H, D], lse [B, T, H] float32); bq: query tile of the backward.
  """
  return _forward(q, k, v, idx, block, scale, interpret)


def _selected_fwd(q, k, v, idx, block, bq, scale, interpret):
  out, lse = _forward(q, k, v, idx, block, scale, interpret)
  return (out, lse), (q, k, v, idx, out, lse)


def _selected_bwd(block, bq, scale, interpret, res, cts):
  del interpret
  q, k, v, idx, out, lse = res
  dq, dk, dv = nsa_xla.backward(q, k, v, idx, out, lse, cts[0], cts[1], block, bq, scale)
  return dq, dk, dv, None


selected.defvjp(_selected_fwd, _selected_bwd)
