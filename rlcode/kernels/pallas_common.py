"""What every family's Pallas kernels share: the call, float32 matmuls, GPU size rules.

Kernel bodies use only generic Pallas (`pl.program_id`, `pl.ds` slices of
refs, jnp/lax ops, `lax.fori_loop`) and 2-D matmuls, so they run in the
interpreter anywhere (`interpret=True`, how the tests run them on CPU) and
lower through Triton on GPU. On GPU we ask for the Triton backend explicitly
(`jax.experimental.pallas.triton.CompilerParams`): since jax 0.10 a bare
`pallas_call` goes to Mosaic GPU, whose pallas_call path needs a different
kernel style (TMA/warpgroup pipelining) than these Triton-style kernels, which
slice whole-sequence refs inside a loop. Triton requires power-of-two tile
sizes and head_dim, and matmul dims of at least 16.

Must not: hold a kernel of its own.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from rlcode.kernels import tiling

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
    return tiling.tile_sizes(bq, bk, t, s)
  return max(16, min(bq, next_pow2(t))), max(16, min(bk, next_pow2(s)))


def gpu_rows(n: int, interpret: bool) -> int:
  """Rows of a matmul operand that holds n: n in the interpreter, else a power of two >= 16."""
  return n if interpret else max(16, next_pow2(n))


def scalars(*columns):
  """Per (row, tile) int32 [B, n, C] from [B, n] or [B] columns, read as scalars in kernels."""
  b, n = next(c.shape for c in columns if c.ndim == 2)
  return jnp.stack([jnp.broadcast_to(c[:, None] if c.ndim == 1 else c, (b, n))
                    for c in columns], axis=-1).astype(jnp.int32)


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


def softmax_init(rows: int, d: int):
  """The online softmax's empty state (running max, sum, unnormalised output)."""
  return jnp.full((rows,), NEG, F32), jnp.zeros((rows,), F32), jnp.zeros((rows, d), F32)


def softmax_step(carry, q, kj, vj, ok, scale: float):
  """The online softmax state of q [rows, D] updated with one key tile kj, vj where ok."""
  m, l, acc = carry
  s = jnp.where(ok, dot_nt(q, kj) * scale, NEG)
  m_new = jnp.maximum(m, jnp.max(s, axis=1))
  p = jnp.where(ok, jnp.exp(s - m_new[:, None]), 0.0)
  alpha = jnp.exp(m - m_new)
  l = alpha * l + jnp.sum(p, axis=1)
  acc = alpha[:, None] * acc + dot_nn(p.astype(vj.dtype), vj)
  return m_new, l, acc


def softmax_finish(carry, o_ref, lse_ref) -> None:
  """Writes the normalised output and the log-sum-exp; rows that saw nothing get 0 and -inf."""
  m, l, acc = carry
  seen = l > 0
  l_safe = jnp.where(seen, l, 1.0)
  o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(seen, m + jnp.log(l_safe), -jnp.inf)


def grad_probs(q, kj, vj, do, lse, delta, ok, scale: float):
  """The backward's recomputed probabilities p and dS = p * (dP - delta), q's rows by kj.

  lse and delta [rows]: the forward's log-sum-exp (finite; -inf rows replaced
  by the caller) and rowsum(dO * O) minus the lse cotangent.
  """
  p = jnp.where(ok, jnp.exp(dot_nt(q, kj) * scale - lse[:, None]), 0.0)
  return p, p * (dot_nt(do, vj) - delta[:, None])
