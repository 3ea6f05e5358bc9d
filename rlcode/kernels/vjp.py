"""The custom_vjp every tiled attention shares: save the inputs, out and lse; recompute.

Must not: hold attention math (the forward and backward are the caller's).
"""

from __future__ import annotations

import inspect

import jax


def attention_vjp(forward, backward, num_inputs: int):
  """forward, differentiable by `backward` (FlashAttention-2 style).

  forward(*inputs, *static) -> (out, lse); inputs are (q, k, v, ...) and the
  rest are static (sizes, masks, flags). backward(*inputs, out, lse, dout,
  dlse, *static) -> (dq, dk, dv): the inputs after q, k, v (block indices,
  tile layouts) get no gradient. The residuals are the inputs, out and lse.
  """
  static = tuple(range(num_inputs, len(inspect.signature(forward).parameters)))
  fn = jax.custom_vjp(forward, nondiff_argnums=static)

  def fwd(*args):
    out, lse = forward(*args)
    return (out, lse), (*args[:num_inputs], out, lse)

  def bwd(*args):
    *static_args, res, (dout, dlse) = args
    grads = backward(*res, dout, dlse, *static_args)
    return (*grads, *(None,) * (num_inputs - 3))

  fn.defvjp(fwd, bwd)
  return fn
