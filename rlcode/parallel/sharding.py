"""Meshes, logical-axis rules and sharded initialisation.

Sharding is data, not code at call sites: every parameter carries logical axis
names in its `axes` metadata (`nnx.Param(value, axes=("embed", "mlp"))`), and
one rules table maps logical names to mesh axes. Activations are constrained
by logical names too, through `constrain`, which does nothing outside an
`activate(mesh)` block, so the same model code runs on one device and on a mesh.

This module must not know any particular model; it only reads metadata.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlcode.errors import BadInput

# The mesh's axes, outermost first: a device's neighbours along `tensor` are the closest
# (the axis whose collectives run every layer on activations), then `context`, then
# `expert` (a mixture-of-experts layer's gather and reduce-scatter of tokens).
MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")

# Logical axis name -> mesh axes. Batch-like axes split over data, fsdp and expert (outside
# its MoE layers an expert-parallel group is data-parallel, as in DeepSpeed-MoE); sequences
# over context; parameters are fully sharded over fsdp on their embed dimension and split
# Megatron-style over tensor on heads / mlp / vocab; routed experts over expert.
DEFAULT_RULES: dict[str, Any] = {
    "batch": ("data", "fsdp", "expert"),
    "length": "context",
    "embed": "fsdp",
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "layers": None,
    "lora": None,
    "experts": "expert",
}


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, context: int = 1,
              devices: Sequence[jax.Device] | None = None, expert: int = 1) -> Mesh:
  """A (data, fsdp, expert, context, tensor) mesh over the first product-of-sizes devices.

  A size of -1 takes all devices not used by the other axes.
  """
  devices = list(jax.devices() if devices is None else devices)
  named = {"data": data, "fsdp": fsdp, "expert": expert, "context": context, "tensor": tensor}
  sizes = [named[a] for a in MESH_AXES]
  described = " ".join(f"{a}={named[a]}" for a in MESH_AXES)
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh: at most one axis may be -1, got {described}")
  if -1 in sizes:
    rest = math.prod(s for s in sizes if s != -1)
    sizes[sizes.index(-1)] = len(devices) // rest
  if any(s < 1 for s in sizes):
    raise ValueError(f"mesh: sizes must be positive, got {described}")
  need = math.prod(sizes)
  if need > len(devices):
    raise ValueError(f"mesh: {'*'.join(MESH_AXES)} = {need} but only {len(devices)} devices "
                     f"are available ({jax.default_backend()})")
  return Mesh(np.array(devices[:need]).reshape(sizes), MESH_AXES)


def batch_shards(mesh: Mesh | None) -> int:
  """How many ways a mesh's batch axes (data x fsdp x expert) split the rows; 1 without a
  mesh."""
  if mesh is None:
    return 1
  shape = dict(mesh.shape)
  return math.prod(shape.get(a, 1) for a in ("data", "fsdp", "expert"))


def mesh_from_config(mesh_cfg) -> Mesh:
  return make_mesh(**{a: mesh_cfg[a] for a in MESH_AXES})


def parse_mesh(spec: str, what: str = "--mesh") -> dict[str, int]:
  """Axis sizes from "data=1,fsdp=9,tensor=8"; an axis left out has size 1.

  Raises BadInput naming `what` for an unknown axis, a repeated one or a size that is
  not a positive integer.
  """
  sizes = dict.fromkeys(MESH_AXES, 1)
  seen = set()
  for item in filter(None, (part.strip() for part in spec.split(","))):
    name, eq, value = item.partition("=")
    name = name.strip()
    if name not in sizes or not eq or name in seen:
      raise BadInput(f"{what} {spec!r}: expected axis=size items over the axes {MESH_AXES}, "
                     "each at most once, for example data=1,fsdp=4,tensor=2")
    if not value.strip().isdigit() or int(value) < 1:
      raise BadInput(f"{what} {spec!r}: the size of {name} must be a positive integer")
    sizes[name] = int(value)
    seen.add(name)
  if not seen:
    raise BadInput(f"{what} {spec!r}: name at least one axis, for example fsdp=4")
  return sizes


def format_mesh(sizes: Mapping[str, int]) -> str:
  """"data=8,fsdp=8": the axes of size > 1 (the first axis when all are 1), as --mesh
  takes them."""
  shown = [a for a in MESH_AXES if sizes.get(a, 1) != 1] or [MESH_AXES[0]]
  return ",".join(f"{a}={sizes.get(a, 1)}" for a in shown)


_ACTIVE: contextvars.ContextVar[tuple[Mesh, Mapping[str, Any]] | None] = (
    contextvars.ContextVar("rlcode_mesh", default=None))


@contextlib.contextmanager
def activate(mesh: Mesh, rules: Mapping[str, Any] | None = None):
  """Makes `mesh` (and the rules) the target of `constrain` and `logical_sharding`."""
  token = _ACTIVE.set((mesh, dict(DEFAULT_RULES if rules is None else rules)))
  try:
    yield mesh
  finally:
    _ACTIVE.reset(token)


def active_mesh() -> Mesh | None:
  active = _ACTIVE.get()
  return None if active is None else active[0]


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int] | None = None,
                    *, mesh: Mesh | None = None, rules: Mapping[str, Any] | None = None,
                    what: str = "array") -> P:
  """PartitionSpec for logical `axes`.

  With `shape` given, a dimension that the mesh axes do not divide is
  replicated instead, with a warning naming `what` (for example 4 KV heads on a
  tensor axis of 8): the layout changes, the numbers do not.
  """
  active = _ACTIVE.get()
  if mesh is None and active is not None:
    mesh = active[0]
  if rules is None:
    rules = active[1] if active is not None else DEFAULT_RULES
  spec, used = [], set()
  for i, name in enumerate(axes):
    if name is not None and name not in rules:
      raise KeyError(f"{what}: logical axis {name!r} has no sharding rule; "
                     f"known: {sorted(rules)}")
    mesh_axes = rules.get(name) if name is not None else None
    if mesh_axes is None:
      spec.append(None)
      continue
    mesh_axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
    # A mesh axis shards at most one dimension of an array.
    mesh_axes = tuple(a for a in mesh_axes if a not in used)
    if mesh is not None:
      mesh_axes = tuple(a for a in mesh_axes if mesh.shape[a] > 1)
    if shape is not None and mesh is not None and mesh_axes:
      size = math.prod(mesh.shape[a] for a in mesh_axes)
      if shape[i] % size:
        warnings.warn(f"{what}: dimension {i} ({name}={shape[i]}) is not divisible by mesh "
                      f"axes {mesh_axes} (size {size}); replicating it", stacklevel=2)
        mesh_axes = ()
    used.update(mesh_axes)
    spec.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
  return P(*spec)


def logical_sharding(axes: Sequence[str | None], shape: Sequence[int] | None = None,
                     mesh: Mesh | None = None, what: str = "array") -> NamedSharding:
  mesh = mesh or active_mesh()
  if mesh is None:
    raise ValueError("logical_sharding needs a mesh: pass one or use sharding.activate(mesh)")
  return NamedSharding(mesh, logical_to_spec(axes, shape, mesh=mesh, what=what))


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """with_sharding_constraint by logical names; the identity outside `activate`."""
  mesh = active_mesh()
  if mesh is None:
    return x
  return jax.lax.with_sharding_constraint(
      x, NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh=mesh, what="activation")))


def _variable_axes(var: nnx.Variable, path) -> tuple[str | None, ...]:
  axes = var.get_metadata().get("axes")
  if axes is None:
    raise ValueError(f"parameter {'/'.join(map(str, path))} has no `axes` metadata; "
                     "every parameter must name its logical axes")
  if len(axes) != len(var.get_value().shape):
    raise ValueError(f"parameter {'/'.join(map(str, path))}: axes {axes} do not match "
                     f"its shape {var.get_value().shape}")
  return tuple(axes)


def state_shardings(state: nnx.State, mesh: Mesh) -> nnx.State:
  """NamedShardings for every variable of `state` (abstract or concrete) from its axes."""
  def one(path, var):
    axes = _variable_axes(var, path)
    return var.replace(NamedSharding(
        mesh, logical_to_spec(axes, var.get_value().shape, mesh=mesh, what="/".join(map(str, path)))))
  return nnx.map_state(one, state)


def init_sharded(make_module: Callable[[], nnx.Module], mesh: Mesh) -> nnx.Module:
  """Builds `make_module()` with every parameter created directly in its shard.

  The module is first traced abstractly (`nnx.eval_shape`), its shardings read
  from the `axes` metadata, and then created inside one jit whose
  out_shardings place each parameter, so no device ever holds a full copy of a
  sharded parameter.
  """
  abstract = nnx.eval_shape(make_module)
  graphdef, abstract_state = nnx.split(abstract)
  shardings = state_shardings(abstract_state, mesh)

  create = jax.jit(lambda: nnx.state(make_module()), out_shardings=shardings)
  with activate(mesh):
    state = create()
  return nnx.merge(graphdef, state)


def shard_module(module: nnx.Module, mesh: Mesh) -> nnx.Module:
  """Moves an existing module's parameters into their mesh shardings."""
  graphdef, state = nnx.split(module)
  return nnx.merge(graphdef, jax.device_put(state, state_shardings(state, mesh)))
