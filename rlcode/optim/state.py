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


HOST = "pinned_host"


def opt_state_shardings(optimizer: optax.GradientTransformation, params, mesh: Mesh,
                        offload: bool = False):
  """Shardings of the optimiser state of `params` (concrete or abstract, with shardings):
  each moment laid out like its parameter, everything else (counts) replicated; with
  `offload`, all of it in pinned host memory.

  Left to itself, jit(optimizer.init) replicates the moments (zeros do not depend on
  their parameter's values, so its layout does not propagate): under FSDP every device
  would hold every moment, 8 bytes per parameter for a float32 Adam.
  """
  replicated = NamedSharding(mesh, P())
  moved = (lambda s: s.with_memory_kind(HOST)) if offload else (lambda s: s)
  like = lambda x: moved(x.sharding if isinstance(x.sharding, NamedSharding)
                         and x.sharding.mesh == mesh else replicated)
  return optax.tree_map_params(
      optimizer, lambda _, s: s, jax.eval_shape(optimizer.init, params),
      jax.tree.map(like, params), transform_non_params=lambda _: moved(replicated))


def init_state(model: nnx.Module, optimizer: optax.GradientTransformation,
               mesh: Mesh, trainable=nnx.Param, offload: bool = False) -> TrainState:
  """The model's params, fresh optimiser state for its `trainable` params (moments
  sharded like their params, in pinned host memory with `offload`; scalars replicated
  over the mesh) and step 0."""
  params = nnx.state(model, nnx.Param)
  train, _ = split_trainable(params, trainable)
  replicated = NamedSharding(mesh, P())
  # Every optimiser leaf gets a NamedSharding on the mesh: the jitted step returns
  # such shardings, and any other kind in the input would make its second call
  # recompile (a mismatch in the jit cache key).
  opt_state = jax.jit(optimizer.init, out_shardings=opt_state_shardings(
      optimizer, train, mesh, offload))(train)
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


def gradients(loss_fn, params, batch):
  """((loss, metrics), grads) of loss_fn(params, batch) -> (loss, metrics): what
  `finite_step` differentiates with unless given another (micro-batches: rlcode.rl.grpo)."""
  return jax.value_and_grad(loss_fn, has_aux=True)(params, batch)


def split_trainable(params: nnx.State, trainable=nnx.Param) -> tuple[nnx.State, nnx.State]:
  """(the params the optimiser trains, the rest): everything and nothing by default;
  the adapters and the frozen base with LoRA (rlcode.models.lora.trainable)."""
  return nnx.split_state(params, trainable, ...)


def finite_step(loss_fn, optimizer: optax.GradientTransformation, state: TrainState, batch, *,
                trainable=nnx.Param, grads_fn=gradients, offload: bool = False):
  """One optimiser step on `loss_fn(params, batch) -> (loss, metrics)`, taken only when the
  loss and the gradient norm are finite: otherwise params, optimiser state and step count
  stay as they were. Returns (state, metrics + {"grad_norm", "skipped"}). Traced inside
  the caller's jit (the GRPO update, the reward model's).

  Only the `trainable` params are differentiated and updated (the optimiser state covers
  them alone, see init_state); the others are read as they are. grads_fn(loss, params,
  batch) -> ((loss, metrics), grads) computes the gradient (`gradients` by default).
  offload: the optimiser state lives in host memory (init_state's `offload`): it comes to
  the device for the update and goes back (the jit's out_shardings say where)."""
  train, frozen = split_trainable(state.params, trainable)
  merged_loss = lambda tr, *args: loss_fn(nnx.merge_state(tr, frozen), *args)
  (loss, metrics), grads = grads_fn(merged_loss, train, batch)
  grad_norm = optax.tree.norm(grads)
  old_opt = state.opt_state
  if offload:
    old_opt = jax.device_put(old_opt, jax.memory.Space.Device)
  updates, opt_state = optimizer.update(grads, old_opt, train)
  new_train = optax.apply_updates(train, updates)
  ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
  metrics.update(grad_norm=grad_norm, skipped=1.0 - ok.astype(jnp.float32))
  params = nnx.merge_state(keep(new_train, train), frozen)
  opt_state = keep(opt_state, old_opt)
  if offload:
    opt_state = jax.device_put(opt_state, jax.memory.Space.Host)
  return TrainState(params=params, opt_state=opt_state,
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
