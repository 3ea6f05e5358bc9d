"""The decoder's one matmul shape: a contraction written as a single 2-D matmul.

Its own module because the blocks and the LoRA adapters on their projections both use it.
"""

from __future__ import annotations

import math

import jax

from rlcode.parallel import sharding


def dense(x: jax.Array, w: jax.Array, contract: int = 1) -> jax.Array:
  """Contracts the last `contract` dims of x with the first of w, as one 2-D matmul.

  XLA:CPU runs a [N, K] x [K, M] matmul 2-3x faster than the same contraction
  written as an einsum over [B, T, ...] operands, and on accelerators the
  reshapes are free. Under a mesh with a `tensor` axis, w keeps its output dims
  (below).
  """
  k = math.prod(w.shape[:contract])
  lead, tail = x.shape[:x.ndim - contract], w.shape[contract:]
  x2 = x.reshape(-1, k)
  mesh = sharding.active_mesh()
  if len(tail) > 1 and mesh is not None and mesh.shape.get("tensor", 1) > 1:
    # Under a tensor axis w keeps its output dims: merging them would lose the split of an
    # inner one (the fused MLP's [embed, 2, mlp] over tensor), so the partitioned program
    # would gather the whole weight for the reshape, every step. (Without one the merged
    # 2-D matmul stays: XLA:CPU rounds the two forms differently.)
    y = jax.lax.dot_general(x2, w.reshape(k, *tail), (((1,), (0,)), ((), ())))
  else:
    y = x2 @ w.reshape(k, -1)
  return y.reshape(*lead, *tail)
