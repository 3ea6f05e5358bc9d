"""One run over many processes: `jax.distributed` set-up, device layout, and the few
places where host data crosses processes.

`rlcode train` runs unchanged as N processes (one per host, or several on one host
for tests): each calls `initialize` first, then every process runs the same loop.
The trainer's mesh is global (the update step is one SPMD program over all
processes); each process samples and scores its own share of a step's prompts on its
own devices, with the randomness of the global rows (rlcode.sampling's row_offset),
so the samples do not depend on the process layout. A group never spans processes,
so advantages are local. What crosses processes is small: the batch's padded widths
and the per-row statistics the metrics are computed from (`gather`), and the batch
itself, assembled from the processes' rows into global arrays (`global_batch`).
Process 0 writes metrics, config.json and TensorBoard; Orbax checkpoints are saved
and restored by all processes together.

With one process every function here is the identity or its single-process
equivalent, so a single-process run computes exactly what it did before.

This module must not know about models, losses or rewards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from rlcode.parallel import sharding
from rlcode.errors import BadInput

# The environment variables `initialize` reads when no flag is given (JAX itself reads
# JAX_COORDINATOR_ADDRESS; cluster schedulers such as SLURM are detected by JAX).
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Joins a multi-process run when one is asked for; returns whether it did.

  Arguments left out come from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
  JAX_PROCESS_ID. With none of them set this is a single-process run and nothing
  happens. Must run before JAX touches a device. On CPU, cross-process collectives
  go through gloo.
  """
  coordinator = coordinator or os.environ.get(ENV_COORDINATOR) or None
  if num_processes is None and os.environ.get(ENV_NUM_PROCESSES):
    num_processes = _int_env(ENV_NUM_PROCESSES)
  if process_id is None and os.environ.get(ENV_PROCESS_ID):
    process_id = _int_env(ENV_PROCESS_ID)
  if coordinator is None and num_processes is None and process_id is None:
    return False
  if num_processes is not None and num_processes < 1:
    raise BadInput(f"--num-processes={num_processes} must be at least 1")
  if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
    raise BadInput(f"--process-id={process_id} must be in [0, {num_processes})")
  if num_processes == 1:
    return False
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                             process_id=process_id)
  return True


def _int_env(name: str) -> int:
  value = os.environ[name]
  if not value.strip().lstrip("-").isdigit():
    raise BadInput(f"${name}={value!r}: expected an integer")
  return int(value)


def is_main() -> bool:
  """Whether this process writes the run's files (metrics, config.json, TensorBoard)."""
  return jax.process_index() == 0


@contextlib.contextmanager
def main_first(name: str):
  """Process 0 runs the block first, the others after it: what it prepares on disk (a
  dataset built on first use) the others then read instead of building it at once."""
  if jax.process_count() == 1:
    yield
    return
  from jax.experimental import multihost_utils
  if not is_main():
    multihost_utils.sync_global_devices(name)
  yield
  if is_main():
    multihost_utils.sync_global_devices(name)


# --------------------------------------------------------------------------- devices


def _process_devices(process: int) -> list[jax.Device]:
  return sorted((d for d in jax.devices() if d.process_index == process), key=lambda d: d.id)


def meshes(mesh_sizes: Mapping[str, int], sampler_spec: str) -> tuple[Mesh, Mesh]:
  """(the trainer's global mesh, this process's sampler mesh).

  Without a sampler spec the trainer's mesh spans every process's devices in order and
  each process samples on its own block of it (`local_block`). With one
  ("data=1,fsdp=1,tensor=4"), each process gives its first T / N devices to the
  trainer (T the trainer mesh's size, N processes) and the next ones to a sampler mesh
  of that shape: disjoint device sets, each with its own sharding.
  """
  n = jax.process_count()
  sizes = {a: int(mesh_sizes.get(a, 1)) for a in sharding.MESH_AXES}
  if not sampler_spec:
    trainer = sharding.make_mesh(**sizes)
    return trainer, local_block(trainer)
  sampler_sizes = sharding.parse_mesh(sampler_spec, "config.sampler_mesh")
  per_process = math.prod(sizes.values())
  local = _process_devices(jax.process_index())
  need = math.prod(sampler_sizes.values())
  if per_process % n or per_process // n + need > len(local):
    raise BadInput(
        f"config.mesh {sharding.format_mesh(mesh_sizes)} and config.sampler_mesh "
        f"{sampler_spec!r} need {per_process // max(n, 1)} + {need} devices in each of the "
        f"{n} processes, which have {len(local)} each")
  share = per_process // n
  trainer_devices = [d for p in range(n) for d in _process_devices(p)[:share]]
  trainer = sharding.make_mesh(**sizes, devices=trainer_devices)
  local_block(trainer)  # checks the layout
  sampler = sharding.make_mesh(**sampler_sizes,
                               devices=local[share:share + need])
  return trainer, sampler


def _block_bounds(mesh: Mesh, process: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
  mine = np.vectorize(lambda d: d.process_index == process)(mesh.devices)
  where = np.argwhere(mine)
  lo, hi = where.min(0), where.max(0) + 1
  box = mine[tuple(slice(a, b) for a, b in zip(lo, hi))]
  if not box.all() or box.size != mine.sum():
    raise BadInput(f"the mesh {dict(mesh.shape)} does not give process {process} one block "
                   "of devices; choose sizes whose leading axes split the processes")
  for axis in ("context", "tensor"):
    i = mesh.axis_names.index(axis)
    if hi[i] - lo[i] != mesh.shape[axis]:
      raise BadInput(f"the mesh {dict(mesh.shape)} splits the {axis} axis over processes; "
                     "each process must hold whole rows of the batch (split data or fsdp)")
  return tuple(lo), tuple(hi)


def local_block(mesh: Mesh) -> Mesh:
  """This process's devices of `mesh`, as a mesh with the same axis names (the mesh
  itself in a single-process run)."""
  if jax.process_count() == 1:
    return mesh
  lo, hi = _block_bounds(mesh, jax.process_index())
  return Mesh(mesh.devices[tuple(slice(a, b) for a, b in zip(lo, hi))], mesh.axis_names)


def process_mesh(mesh: Mesh) -> Mesh:
  """`mesh`'s devices with a leading "process" axis and each process's block behind it.

  A sharding on this mesh that leaves "process" out holds one whole copy of an array
  in every process, laid out over its block as on `local_block(mesh)`.
  """
  blocks = []
  for p in range(jax.process_count()):
    lo, hi = _block_bounds(mesh, p)
    blocks.append(mesh.devices[tuple(slice(a, b) for a, b in zip(lo, hi))])
  return Mesh(np.stack(blocks), ("process", *mesh.axis_names))


# --------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Share:
  """This process's part of a step: prompts [start, stop) of the step's P prompts, and
  rows from `row_offset` (G rows per prompt)."""

  start: int
  stop: int
  row_offset: int

  @classmethod
  def of(cls, prompts: int, group_size: int, data_parallel: int) -> Share:
    """With several processes the prompts must split over the trainer's
    `data_parallel` devices: each process then holds whole prompts of the batch."""
    n, me = jax.process_count(), jax.process_index()
    if n > 1 and prompts % data_parallel:
      raise BadInput(f"rl.prompts_per_step={prompts} does not split over the "
                     f"{data_parallel} data-parallel devices of {n} processes")
    per = prompts // n
    return cls(me * per, (me + 1) * per, me * per * group_size)

  def take(self, items: Sequence) -> list:
    return list(items[self.start:self.stop])


def gather(local: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Each array concatenated over processes in process order (as is, with one)."""
  if jax.process_count() == 1:
    return {k: np.asarray(v) for k, v in local.items()}
  from jax.experimental import multihost_utils
  out = multihost_utils.process_allgather({k: np.asarray(v) for k, v in local.items()},
                                          tiled=True)
  return {k: np.asarray(v) for k, v in out.items()}


def gather_json(value) -> list:
  """`value` (anything JSON can hold) from every process, in process order."""
  if jax.process_count() == 1:
    return [value]
  from jax.experimental import multihost_utils
  data = np.frombuffer(json.dumps(value).encode(), np.uint8)
  longest = int(multihost_utils.process_allgather(np.array([data.size]), tiled=True).max())
  padded = np.zeros(longest, np.uint8)
  padded[:data.size] = data
  everyone = multihost_utils.process_allgather(padded, tiled=False)
  return [json.loads(bytes(row).rstrip(b"\0").decode()) for row in np.asarray(everyone)]


def mean_over_processes(values: Mapping[str, float]) -> dict[str, float]:
  """Each key's mean over processes, given equally many rows in each.

  Rewards report means over their rows and may leave out a key none of a process's
  rows had (a test status that did not occur): that process counts 0 for it, which
  is the batch-wide mean. With one process the values come back as they are.
  """
  if jax.process_count() == 1:
    return dict(values)
  everyone = gather_json({k: float(v) for k, v in values.items()})
  keys = sorted(set().union(*everyone))
  return {k: sum(d.get(k, 0.0) for d in everyone) / len(everyone) for k in keys}


def global_batch(local, shardings):
  """A pytree of global arrays from each process's rows (leading axis) of it.

  With one process this is jax.device_put: the same values in the same layout.
  """
  if jax.process_count() == 1:
    return jax.device_put(local, shardings)
  n = jax.process_count()
  return jax.tree.map(
      lambda x, s: jax.make_array_from_process_local_data(
          s, np.asarray(x), (x.shape[0] * n, *x.shape[1:])), local, shardings)


def put_global(tree, shardings):
  """Host values that every process holds in full, placed in global `shardings`."""
  if jax.process_count() == 1:
    return jax.device_put(tree, shardings)
  return jax.tree.map(
      lambda x, s: jax.make_array_from_callback(np.shape(x), s, lambda i: np.asarray(x)[i]),
      tree, shardings)


def to_local(tree, mesh: Mesh, shardings):
  """The local copy in every process of a pytree laid out on `process_mesh(...)`:
  each process's shards, now arrays on its own block (`local_block`, `shardings`)."""
  def one(x, s: NamedSharding):
    by_device = {shard.device: shard.data for shard in x.addressable_shards}
    return jax.make_array_from_single_device_arrays(
        x.shape, s, [by_device[d] for d in mesh.devices.flat])
  return jax.tree.map(one, tree, shardings)
