"""The train state and its layout: params, optimiser state and step, sharded over a mesh.

`init_state` creates the optimiser state with each moment laid out like its parameter;
`finite_step` is the one optimiser step every trainer traces inside its jit (GRPO, SFT,
the reward model), skipping a step whose loss or gradient is not finite; `run_passes`
calls a compiled update several times on one batch. This module must not know any
loss or algorithm.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlcode.parallel import sharding


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  params: nnx.State
  opt_state: optax.OptState
  step: jax.Array


def opt_state_shardings(optimizer: optax.GradientTransformation, params, mesh: Mesh):
  """Shardings of the optimiser state of `params` (concrete or abstract, with shardings):
  each moment laid out like its parameter, everything else (counts) replicated.

  Left to itself, jit(optimizer.init) replicates the moments (zeros do not depend on
  their parameter's values, so its layout does not propagate): under FSDP every device
  would hold every moment, 8 bytes per parameter for a float32 Adam.
  """
  replicated = NamedSharding(mesh, P())
  like = lambda x: (x.sharding if isinstance(x.sharding, NamedSharding)
                    and x.sharding.mesh == mesh else replicated)
  return optax.tree_map_params(
      optimizer, lambda _, s: s, jax.eval_shape(optimizer.init, params),
      jax.tree.map(like, params), transform_non_params=lambda _: replicated)


def init_state(model: nnx.Module, optimizer: optax.GradientTransformation,
               mesh: Mesh) -> TrainState:
  """The model's params, fresh optimiser state (moments sharded like their params,
  scalars replicated over the mesh) and step 0."""
  params = nnx.state(model, nnx.Param)
  replicated = NamedSharding(mesh, P())
  # Every optimiser leaf gets a NamedSharding on the mesh: the jitted step returns
  # such shardings, and any other kind in the input would make its second call
  # recompile (a mismatch in the jit cache key).
  opt_state = jax.jit(optimizer.init,
                      out_shardings=opt_state_shardings(optimizer, params, mesh))(params)
  return TrainState(params=params, opt_state=opt_state,
                    step=jax.device_put(jnp.zeros((), jnp.int32), replicated))


def batch_shardings(mesh: Mesh, example) -> object:
  """Row-sharded over the batch axes, whatever the leaf's rank (`example` may be abstract)."""
  def one(x):
    return NamedSharding(mesh, sharding.logical_to_spec(
        ("batch",) + (None,) * (x.ndim - 1), x.shape, mesh=mesh, what="batch"))
  return jax.tree.map(one, example)


def state_shardings(state: TrainState, mesh: Mesh):
  """Shardings of a TrainState: params by their axes, optimiser moments likewise."""
  return jax.tree.map(lambda x: getattr(x, "sharding", NamedSharding(mesh, P())), state)


def finite_step(loss_fn, optimizer: optax.GradientTransformation, state: TrainState, batch):
  """One optimiser step on `loss_fn(params, batch) -> (loss, metrics)`, taken only when the
  loss and the gradient norm are finite: otherwise params, optimiser state and step count
  stay as they were. Returns (state, metrics + {"grad_norm", "skipped"}). Traced inside
  the caller's jit (the GRPO update, the reward model's)."""
  (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
  grad_norm = optax.tree.norm(grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
  metrics.update(grad_norm=grad_norm, skipped=1.0 - ok.astype(jnp.float32))
  return TrainState(params=keep(params, state.params), opt_state=keep(opt_state, state.opt_state),
                    step=state.step + ok.astype(jnp.int32)), metrics


def run_passes(update, state: TrainState, batch, passes: int, *, step: int,
               on_nonfinite: str):
  """`passes` calls of a compiled update on one batch: (state, the last pass's metrics on
  the host, seconds). A skipped (non-finite) step raises when on_nonfinite is "stop"."""
  start = time.perf_counter()
  for _ in range(passes):
    state, m = update(state, batch)
  m = jax.device_get(m)
  seconds = time.perf_counter() - start
  if m["skipped"] and on_nonfinite == "stop":
    raise FloatingPointError(f"step {step}: non-finite loss or gradient "
                             f"(loss={m['loss']}, grad_norm={m['grad_norm']})")
  return state, m, seconds
