"""`rlcode plan`: what a config needs per device on hardware we do not have, without running it.

    rlcode plan --config configs/qwen2_7b_plan.py --devices gb200-nvl72 \\
        --mesh data=8,fsdp=8 --sampler-mesh data=2,tensor=4
    rlcode plan --config configs/grpo_tiny.py --devices 72 --mesh data=9,fsdp=8 --hardware h200

For N devices (a count, or a system from SYSTEMS), a subprocess started with
--xla_force_host_platform_device_count=N (so the caller's own devices do not matter)
lowers and compiles, with abstract parameters (jax.ShapeDtypeStruct: nothing of model
size is ever allocated):
  * the update step train.py runs (forward, backward and optimiser, one SPMD program
    over the trainer's mesh), for the config's batch (rl.prompts_per_step x
    rl.group_size rows, prompts of --prompt-len tokens, rl.max_new_tokens completions);
  * the sampler's decode loop (rlcode.sampling: a while loop of one token per row over
    the KV cache) over the sampler's mesh (config.sampler_mesh or --sampler-mesh on the
    devices after the trainer's, else the trainer's mesh).
It prints per device: memory (parameters, optimiser state and KV cache by our own
accounting from the shardings; activations and temporaries, and the peak, from
compiled.memory_analysis()), FLOPs (an analytic count next to XLA's cost_analysis,
which counts a while loop's body once), the collectives of the optimised HLO with
their bytes (a loop body's counted once per iteration), and an estimated time from
the hardware's published peaks. A mesh that does not divide the model (heads, KV
heads, layers, hidden size, MLP width or vocabulary on the mesh axes the sharding rules
map them to) or the batch is refused with one line (rlcode.errors.BadInput).

The estimate, per device and per program: compute time = FLOPs / peak dense bf16
FLOP/s (for the update, the larger of the analytic share and XLA's count, which sees
work the mesh repeats on several devices); memory time = bytes / HBM bandwidth (XLA's
bytes accessed for the update; for decoding, each step reads the weights as the loop
holds them and the device's part of the KV cache: XLA gathers fsdp- and data-sharded
weights once, before the loop, and keeps tensor-parallel splits; the embedding table is
counted whole, though a lookup reads only its rows. XLA:CPU's bytes accessed for the
loop body, every operand of every op, are ~8x that for the 7B plan: printed, not used);
collective time = bytes on the wire / link bandwidth (ring algorithms: an all-gather or
reduce-scatter of S bytes over g devices moves S (g - 1) / g per device, an all-reduce
twice that; NVLink within a domain, the network beyond). time = max(compute, memory)
+ collectives: no overlap of communication with computation, so an upper bound for a
well-overlapped program. One GRPO step = rl.num_passes updates + a proximal or
reference forward when the config needs one (1/3 of an update's FLOPs) + prefill
(analytic, compute-bound) + decoding + one weight sync when the sampler has its own
devices.

Published figures per GPU (dense: NVIDIA's Tensor Core figures with sparsity, halved):

| GPU   | bf16 dense FLOP/s | HBM        | HBM bytes/s | NVLink, one direction | source |
|-------|-------------------|------------|-------------|-----------------------|--------|
| h200  | 989e12            | 141 GB     | 4.8e12      | 450e9 (900 GB/s both) | NVIDIA H200 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h200 (BF16 1,979 TFLOPS with sparsity; 141 GB HBM3e at 4.8 TB/s; NVLink 900 GB/s) |
| gb200 | 2.5e15            | 186 GB     | 8.0e12      | 900e9 (1.8 TB/s both) | NVIDIA GB200 NVL72 product page, nvidia.com/en-us/data-center/gb200-nvl72 (rack of 72 GPUs: BF16 360 PFLOPS with sparsity, up to 13.4 TB HBM3e at 576 TB/s, NVLink 130 TB/s), divided by 72 |

Systems: h200x8 is one HGX H200 board (8 GPUs in one NVLink domain); gb200-nvl72 is
one rack (72 GPUs in one NVLink domain). Beyond a domain, each GPU's network link is
taken as 50 GB/s per direction (one 400 Gb/s ConnectX-7 NIC per GPU).

What the numbers are not: XLA:CPU compiles these programs, so fusion, activation
buffers and collective choices are the CPU compiler's, not XLA:GPU's; the attention
kernels are the CPU ones (blockwise XLA), not Pallas or cuDNN. Parameters, optimiser
state, KV cache, FLOPs and collective bytes follow from the shardings and hold on any
backend; activation memory and the time estimate are first-order.

This module must not allocate a model, run a step, or import the data pipeline.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from rlcode import config_lib, sharding
from rlcode.errors import BadInput


@dataclasses.dataclass(frozen=True)
class Hardware:
  """Peak figures of one device, and how its devices are connected."""

  name: str
  flops: float              # dense bf16 FLOP/s
  hbm_bytes_per_s: float
  hbm_bytes: float
  link_bytes_per_s: float   # one direction, within an NVLink domain
  domain: int               # devices per NVLink domain
  network_bytes_per_s: float = 50e9  # one direction, between domains


GPUS = {
    "h200": Hardware("h200", 989e12, 4.8e12, 141e9, 450e9, 8),
    "gb200": Hardware("gb200", 2.5e15, 8.0e12, 186e9, 900e9, 72),
}
SYSTEMS = {"h200x8": ("h200", 8), "gb200-nvl72": ("gb200", 72)}


def resolve_devices(devices: str, hardware: str | None) -> tuple[int, Hardware]:
  """(device count, per-device figures) from --devices (a count or a system) and
  --hardware (a GPU of GPUS; default h200, or the system's)."""
  if devices in SYSTEMS:
    gpu, count = SYSTEMS[devices]
  elif devices.isdigit() and int(devices) > 0:
    gpu, count = "h200", int(devices)
  else:
    raise BadInput(f"--devices {devices!r}: expected a positive count or one of "
                   f"{sorted(SYSTEMS)}")
  gpu = hardware or gpu
  if gpu not in GPUS:
    raise BadInput(f"--hardware {gpu!r}: expected one of {sorted(GPUS)}")
  return count, GPUS[gpu]


# --------------------------------------------------------------------------- the model's shape


def model_config(config):
  """The ModelConfig of config.model (from-scratch arch, or a checkpoint's config.json)."""
  from rlcode.models import build, config as model_cfg_lib
  if config.model.get("hf_path"):
    overrides = {k: config.model[k] for k in ("param_dtype", "dtype", "attn_impl")
                 if k in config.model}
    path = os.path.join(config.model.hf_path, "config.json")
    return model_cfg_lib.from_hf_config(model_cfg_lib.read_hf_config(path), source=path,
                                        **overrides)
  return build.model_config(config.model)


def refuse_undivided(abstract_state, mesh, what: str, rows: int) -> None:
  """BadInput (one line) naming every model dimension the mesh axes its rules map it to
  do not divide (the training code would replicate it with a warning instead), and the
  batch's rows if the data-parallel axes do not divide them."""
  from flax import nnx
  bad = {}
  dp = sharding.batch_shards(mesh)
  if rows % dp:
    bad[" rows"] = f"batch rows={rows} over data x fsdp={dp}"
  for path, var in nnx.to_flat_state(abstract_state):
    axes = var.get_metadata().get("axes") or ()
    for name, size in zip(axes, var.get_value().shape):
      rule = sharding.DEFAULT_RULES.get(name) if name else None
      mesh_axes = (rule,) if isinstance(rule, str) else tuple(rule or ())
      split = math.prod(mesh.shape[a] for a in mesh_axes)
      if split > 1 and size % split:
        bad[name] = f"{name}={size} over {'x'.join(mesh_axes)}={split}"
  if bad:
    raise BadInput(f"{what} {sharding.format_mesh(dict(mesh.shape))} does not divide the model "
                   "and batch: " + "; ".join(bad[k] for k in sorted(bad)))


# --------------------------------------------------------------------------- analytic counts


def forward_flops(cfg, tokens: float, attended: float, logits: float) -> float:
  """FLOPs of a forward pass over `tokens` positions whose queries attend `attended`
  key positions in all (summed over queries), with `logits` output positions."""
  e, f, h, k, d = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                   cfg.head_dim)
  per_layer = e * (h + 2 * k) * d + h * d * e + 3 * e * f
  matmul = 2 * cfg.num_layers * per_layer * tokens
  attention = 4 * cfg.num_layers * h * d * attended
  return matmul + attention + 2 * e * cfg.vocab_size * logits


def update_flops(cfg, prompts: int, rows: int, prompt_len: int, completion_len: int,
                 shared_prefix: bool) -> tuple[float, float]:
  """(forward FLOPs, forward + backward FLOPs) of one update over the whole batch."""
  if shared_prefix:
    tokens = prompts * prompt_len + rows * completion_len
    attended = (prompts * prompt_len * (prompt_len + 1) / 2
                + rows * completion_len * (prompt_len + (completion_len + 1) / 2))
  else:
    seq = prompt_len + completion_len
    tokens, attended = rows * seq, rows * seq * (seq + 1) / 2
  forward = forward_flops(cfg, tokens, attended, rows * completion_len)
  return forward, 3 * forward


def decode_flops(cfg, rows: int, prompt_len: int, new_tokens: int) -> float:
  attended = rows * (new_tokens * prompt_len + new_tokens * (new_tokens + 1) / 2)
  return forward_flops(cfg, rows * new_tokens, attended, rows * new_tokens)


def prefill_flops(cfg, prompts: int, prompt_len: int) -> float:
  return forward_flops(cfg, prompts * prompt_len, prompts * prompt_len * (prompt_len + 1) / 2,
                       prompts)


# --------------------------------------------------------------------------- HLO collectives

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b(pred|[sufc]\d+|bf16)\[([\d,]*)\]")
_OP = re.compile(r"=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\(")
_HEADER = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")


def _bytes(type_text: str) -> int:
  return sum(_DTYPE_BYTES[t] * math.prod(int(x) for x in dims.split(",") if x)
             for t, dims in _SHAPE.findall(type_text))


def _groups(line: str, num_devices: int) -> list[list[int]]:
  """The replica groups of a collective, in the three textual forms XLA prints."""
  explicit = re.search(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", line)
  if explicit:
    return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}",
                                                                    explicit.group(1))]
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
  if iota:
    n, g = int(iota.group(1)), int(iota.group(2))
    dims = [int(x) for x in iota.group(3).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if iota.group(4):
      ids = ids.transpose([int(x) for x in iota.group(4).split(",")])
    return ids.reshape(n, g).tolist()
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,]+)\]"
                   r"(?:T\(([\d,]+)\))?\))?\s*\{([^}]*)\}", line)
  if mesh:
    names = re.findall(r"'([^']+)'=(\d+)", mesh.group(1))
    over = re.findall(r"'([^']+)'", mesh.group(4))
    shape = [int(s) for _, s in names]
    order = [i for i, (a, _) in enumerate(names) if a not in over] + [
        [a for a, _ in names].index(a) for a in over]
    # device_ids, when printed, numbers the mesh's positions: an iota of its own shape,
    # maybe transposed, then laid out in the mesh's shape.
    ids = np.arange(math.prod(shape))
    if mesh.group(2):
      ids = ids.reshape([int(x) for x in mesh.group(2).split(",")])
      if mesh.group(3):
        ids = ids.transpose([int(x) for x in mesh.group(3).split(",")])
    ids = ids.reshape(shape).transpose(order)
    size = math.prod(shape[[a for a, _ in names].index(a)] for a in over)
    return ids.reshape(-1, size).tolist()
  pairs = re.search(r"source_target_pairs=\{(.*?)\}\}?", line)
  if pairs:
    return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs.group(0))]
  return [list(range(num_devices))]


def collectives(hlo: str, num_devices: int, unknown_trips: int = 1) -> list[dict]:
  """The collectives of an optimised HLO module: kind, bytes (of the result), group size,
  the groups, and how many times each runs (a while body's count times its trip
  count, `unknown_trips` where XLA could not tell it)."""
  computations: dict[str, list[str]] = {}
  entry, current = None, None
  for line in hlo.splitlines():
    header = _HEADER.match(line)
    if header:
      current = header.group(1)
      computations[current] = []
      if line.lstrip().startswith("ENTRY"):
        entry = current
    elif current is not None and line.strip() and line.strip() != "}":
      computations[current].append(line)
  times = {name: 0 for name in computations}
  times[entry] = 1
  # Callers are printed after their callees: walk from the entry down, repeatedly.
  for _ in range(len(computations)):
    new = {name: 0 for name in computations}
    new[entry] = 1
    for name, lines in computations.items():
      for line in lines:
        body = re.search(r"body=%?([\w.\-]+)", line)
        if body and " while(" in line:
          trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
          count = int(trips.group(1)) if trips else unknown_trips
          new[body.group(1)] = new.get(body.group(1), 0) + times[name] * count
          continue
        for callee in re.findall(r"(?:calls|to_apply|true_computation|false_computation)="
                                 r"%?([\w.\-]+)", line):
          new[callee] = new.get(callee, 0) + times[name]
        branches = re.search(r"branch_computations=\{([^}]*)\}", line)
        if branches:
          for callee in re.findall(r"%?([\w.\-]+)", branches.group(1)):
            new[callee] = new.get(callee, 0) + times[name]
    if new == times:
      break
    times = new
  out = []
  for name, lines in computations.items():
    for line in lines:
      op = _OP.search(line)
      if not op or times.get(name, 0) == 0:
        continue
      groups = _groups(line, num_devices)
      out.append({"kind": op.group(2), "bytes": _bytes(op.group(1)),
                  "group": len(groups[0]), "groups": groups, "times": times[name]})
  return out


def wire_bytes(c: Mapping) -> float:
  """Bytes one device sends for a collective, ring algorithms."""
  g, size = c["group"], c["bytes"]
  if g <= 1:
    return 0.0
  return {"all-gather": size * (g - 1) / g, "reduce-scatter": size * (g - 1),
          "all-reduce": 2 * size * (g - 1) / g, "all-to-all": size * (g - 1) / g,
          "collective-permute": size}[c["kind"]]


def collective_seconds(cs: Sequence[Mapping], hw: Hardware) -> float:
  total = 0.0
  for c in cs:
    crosses = any(len({d // hw.domain for d in g}) > 1 for g in c["groups"])
    bandwidth = hw.network_bytes_per_s if crosses else hw.link_bytes_per_s
    total += wire_bytes(c) * c["times"] / bandwidth
  return total


def summarise_collectives(cs: Sequence[Mapping]) -> dict[str, dict]:
  out: dict[str, dict] = {}
  for c in cs:
    s = out.setdefault(c["kind"], {"count": 0, "bytes": 0.0, "wire_bytes": 0.0})
    s["count"] += c["times"]
    s["bytes"] += c["bytes"] * c["times"]
    s["wire_bytes"] += wire_bytes(c) * c["times"]
  return out


# --------------------------------------------------------------------------- the worker


def _shard_bytes(abstract_tree) -> int:
  import jax
  total = 0
  for x in jax.tree.leaves(abstract_tree):
    shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    total += math.prod(shape) * x.dtype.itemsize
  return total


def _decode_weight_bytes(abstract_tree, mesh) -> int:
  """Bytes of weights one decode step reads on a device: each weight split only by the
  mesh axes that stay split inside the loop (tensor)."""
  import jax
  total = 0
  for x in jax.tree.leaves(abstract_tree):
    split = 1
    for entry in x.sharding.spec:
      for axis in (entry if isinstance(entry, tuple) else (entry,)):
        if axis == "tensor":
          split *= mesh.shape[axis]
    total += math.prod(x.shape) * x.dtype.itemsize // split
  return total


def _memory(compiled) -> dict:
  m = compiled.memory_analysis()
  return {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
          "temporaries": m.temp_size_in_bytes, "aliased": m.alias_size_in_bytes,
          "peak": (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                   - m.alias_size_in_bytes)}


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return {"flops": float(cost.get("flops", 0.0)),
          "bytes_accessed": float(cost.get("bytes accessed", 0.0))}


# The programs are compiled, never run: LLVM's optimisations only cost time here (buffer
# assignment, memory analysis and HLO cost analysis come before them).
COMPILE_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def analyse(config, devices: int, mesh_spec: str, sampler_spec: str, prompt_len: int) -> dict:
  """Compiles the update step and the decode loop for this process's devices (which must
  be at least `devices`); returns the measurements (no estimate: see `estimate`)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec as P

  from rlcode import grpo, sampling, shared_prefix
  from rlcode.models.decoder import Decoder, KVCache, Prefix

  rl = config.rl
  cfg = model_config(config)
  sizes = sharding.parse_mesh(mesh_spec, "--mesh")
  n_train = math.prod(sizes.values())
  sampler_sizes = sharding.parse_mesh(sampler_spec, "--sampler-mesh") if sampler_spec else None
  n_sample = math.prod(sampler_sizes.values()) if sampler_sizes else 0
  if n_train + n_sample > devices:
    raise BadInput(f"--mesh {mesh_spec!r}" + (f" and --sampler-mesh {sampler_spec!r}"
                                               if sampler_spec else "")
                   + f" need {n_train + n_sample} devices; --devices gives {devices}")
  all_devices = jax.devices()[:devices]
  mesh = sharding.make_mesh(*(sizes[a] for a in sharding.MESH_AXES),
                            devices=all_devices[:n_train])
  sampler_mesh = (sharding.make_mesh(*(sampler_sizes[a] for a in sharding.MESH_AXES),
                                     devices=all_devices[n_train:n_train + n_sample])
                  if sampler_sizes else mesh)
  prompts, group = rl.prompts_per_step, rl.group_size
  rows = prompts * group
  if prompt_len + rl.max_new_tokens > cfg.max_seq_len:
    raise BadInput(f"--prompt-len {prompt_len} + rl.max_new_tokens {rl.max_new_tokens} exceed "
                   f"the model's context of {cfg.max_seq_len}")

  abstract_model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  graphdef, abstract_params = nnx.split(abstract_model, nnx.Param)
  refuse_undivided(abstract_params, mesh, "--mesh", rows)
  refuse_undivided(abstract_params, sampler_mesh, "--sampler-mesh", rows)

  def placed(state, m):
    shardings = sharding.state_shardings(state, m)
    return jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s),
                        state, shardings)

  params = placed(abstract_params, mesh)
  optimizer = grpo.make_optimizer(grpo.OptimizerConfig.from_config(config.optimizer))
  replicated = NamedSharding(mesh, P())
  opt_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                           jax.eval_shape(optimizer.init, params),
                           grpo.opt_state_shardings(optimizer, params, mesh))
  state = grpo.TrainState(params=params, opt_state=opt_state,
                          step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated))
  loss_cfg = grpo.LossConfig.from_config(rl, rl.max_new_tokens)
  tc = rl.max_new_tokens
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
  if rl.shared_prefix:
    example = shared_prefix.GroupedBatch(
        prompt_tokens=i32(prompts, prompt_len), prompt_lengths=i32(prompts),
        completion_tokens=i32(rows, tc), mask=f32(rows, tc), old_logp=f32(rows, tc),
        ref_logp=f32(rows, tc), adv=f32(rows), weight=f32(rows, tc))
    logprob_fn = shared_prefix.logprob_fn(rl.temperature)
  else:
    example = grpo.SequenceBatch(tokens=i32(rows, prompt_len + tc), start=i32(rows),
                                 mask=f32(rows, tc), old_logp=f32(rows, tc),
                                 ref_logp=f32(rows, tc), adv=f32(rows), weight=f32(rows, tc))
    logprob_fn = None
  batch = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       example, grpo.batch_shardings(mesh, example))
  update = grpo.make_update_step(graphdef, optimizer, loss_cfg, mesh, state, example,
                                 logprob_fn=logprob_fn).lower(state, batch).compile(
                                     COMPILE_OPTIONS)

  # The decode loop, as rlcode.sampling.generate calls it with the shared-prompt layout.
  full_graphdef, full_state = nnx.split(abstract_model)
  sampler_state = placed(full_state, sampler_mesh)
  with sharding.activate(sampler_mesh):
    on = lambda axes, shape, dtype: jax.ShapeDtypeStruct(
        shape, dtype, sharding=sharding.logical_sharding(axes, shape))
    kv = lambda: on(("batch", "kv_heads", "length", "head_dim"),
                    (prompts, cfg.num_kv_heads, prompt_len, cfg.head_dim), cfg.jnp_dtype)
    prefix = Prefix(k=tuple(kv() for _ in range(cfg.num_layers)),
                    v=tuple(kv() for _ in range(cfg.num_layers)),
                    lengths=on(("batch",), (prompts,), jnp.int32), head_major=True)
    cache_shape = jax.eval_shape(lambda: KVCache.zeros(cfg, rows, tc))
    cache = KVCache(
        k=tuple(on(("batch", "kv_heads", "length", "head_dim"), x.shape, x.dtype)
                for x in cache_shape.k),
        v=tuple(on(("batch", "kv_heads", "length", "head_dim"), x.shape, x.dtype)
                for x in cache_shape.v),
        lengths=on(("batch",), (rows,), jnp.int32))
    first_logits = on(("batch", "vocab"), (rows, cfg.vocab_size), jnp.float32)
    done = on(("batch",), (rows,), jnp.bool_)
  key = jax.eval_shape(lambda: jax.random.key(0))
  decode = sampling.decode.lower(
      sampler_state, first_logits, prefix, cache, key, done,
      jax.ShapeDtypeStruct((), jnp.int32),
      graphdef=full_graphdef, max_new_tokens=tc, temperature=float(rl.temperature), top_k=0,
      top_p=1.0, stop_tokens=(2,), pad_id=0, mesh=sampler_mesh).compile(COMPILE_OPTIONS)

  forward, train_flops = update_flops(cfg, prompts, rows, prompt_len, tc, rl.shared_prefix)
  return {
      "model": {"parameters": cfg.num_params(), "layers": cfg.num_layers,
                "hidden": cfg.hidden_size, "heads": cfg.num_heads,
                "kv_heads": cfg.num_kv_heads, "vocab": cfg.vocab_size,
                "param_dtype": cfg.param_dtype, "dtype": cfg.dtype},
      "batch": {"prompts": prompts, "rows": rows, "prompt_len": prompt_len,
                "completion_len": tc, "shared_prefix": bool(rl.shared_prefix),
                "num_passes": rl.num_passes, "max_staleness": rl.max_staleness,
                "extra_forward": bool(loss_cfg.uses_reference or rl.max_staleness > 0)},
      "mesh": sharding.format_mesh(dict(mesh.shape)), "mesh_devices": n_train,
      "sampler_mesh": sharding.format_mesh(dict(sampler_mesh.shape)),
      "sampler_devices": n_sample or n_train, "split": bool(sampler_sizes),
      "update": {
          "parameters": _shard_bytes(params), "optimizer": _shard_bytes(opt_state),
          "memory": _memory(update), "xla": _cost(update),
          "flops": train_flops / n_train, "forward_flops": forward / n_train,
          "collectives": collectives(update.as_text(), devices)},
      "decode": {
          "parameters": _shard_bytes(sampler_state),
          "weights_read": _decode_weight_bytes(sampler_state, sampler_mesh),
          "kv_cache": _shard_bytes(prefix) + _shard_bytes(cache),
          "memory": _memory(decode), "xla": _cost(decode),
          "flops": decode_flops(cfg, rows, prompt_len, tc) / (n_sample or n_train),
          "prefill_flops": prefill_flops(cfg, prompts, prompt_len) / (n_sample or n_train),
          "collectives": collectives(decode.as_text(), devices, unknown_trips=tc)},
      "full_params_bytes": cfg.num_params() * jnp.dtype(cfg.jnp_param_dtype).itemsize,
  }


def estimate(result: Mapping, hw: Hardware) -> dict:
  """Seconds per program and per GRPO step from `analyse`'s measurements."""
  up, dec, b = result["update"], result["decode"], result["batch"]
  # The update has no loop, so XLA's count is whole; it exceeds the analytic share of a
  # device where the mesh does not divide the work (a prompt computed on several devices).
  update = {"compute": max(up["flops"], up["xla"]["flops"]) / hw.flops,
            "memory": up["xla"]["bytes_accessed"] / hw.hbm_bytes_per_s,
            "collectives": collective_seconds(up["collectives"], hw)}
  update["total"] = max(update["compute"], update["memory"]) + update["collectives"]
  # Every generated token reads the weights and the KV cache once.
  steps = b["completion_len"]
  decode = {"compute": dec["flops"] / hw.flops,
            "memory": steps * (dec["weights_read"] + dec["kv_cache"]) / hw.hbm_bytes_per_s,
            "collectives": collective_seconds(dec["collectives"], hw)}
  decode["total"] = max(decode["compute"], decode["memory"]) + decode["collectives"]
  prefill = dec["prefill_flops"] / hw.flops
  # The trainer's params reach the sampler's devices once a step (over NVLink).
  sync = result["full_params_bytes"] / hw.link_bytes_per_s if result["split"] else 0.0
  extra = update["total"] / 3 if b["extra_forward"] else 0.0
  train = b["num_passes"] * update["total"] + extra
  sample = prefill + decode["total"]
  # Training and sampling overlap only on their own devices, with rollouts allowed to
  # be a version stale.
  overlapped = result["split"] and b["max_staleness"] >= 1
  step = (max(train, sample) if overlapped else train + sample) + sync
  return {"update": update, "decode": decode, "prefill": prefill, "sync": sync,
          "train": train, "sample": sample, "step": step, "overlapped": overlapped}


# --------------------------------------------------------------------------- the command


def _gb(x: float) -> str:
  return f"{x / 1e9:8.2f} GB"


def format_table(result: Mapping, hw: Hardware, est: Mapping) -> str:
  up, dec, m, b = result["update"], result["decode"], result["model"], result["batch"]
  lines = [
      f"model: {m['parameters'] / 1e9:.2f}B parameters ({m['layers']} layers, hidden "
      f"{m['hidden']}, {m['heads']} heads, {m['kv_heads']} KV heads, vocab {m['vocab']}; "
      f"{m['param_dtype']} params, {m['dtype']} compute)",
      f"batch: {b['prompts']} prompts x {b['rows'] // b['prompts']} = {b['rows']} rows, prompt "
      f"{b['prompt_len']} + completion {b['completion_len']} tokens"
      f"{', shared prefix' if b['shared_prefix'] else ''}, {b['num_passes']} update pass(es)",
      f"hardware: {hw.name} ({hw.flops / 1e12:.0f} TFLOP/s bf16 dense, "
      f"{hw.hbm_bytes_per_s / 1e12:.1f} TB/s HBM, {hw.hbm_bytes / 1e9:.0f} GB, "
      f"{hw.link_bytes_per_s / 1e9:.0f} GB/s link per direction, NVLink domain {hw.domain})",
      f"trainer mesh {result['mesh']} ({result['mesh_devices']} devices); sampler mesh "
      f"{result['sampler_mesh']} ({result['sampler_devices']} devices"
      f"{', its own' if result['split'] else ', shared with the trainer'})",
      "",
      "per device                        update step      decode loop",
      f"  parameters                    {_gb(up['parameters'])}      {_gb(dec['parameters'])}",
      f"  optimiser state               {_gb(up['optimizer'])}",
      f"  KV cache                                         {_gb(dec['kv_cache'])}",
      f"  activations, temporaries (XLA){_gb(up['memory']['temporaries'])}      "
      f"{_gb(dec['memory']['temporaries'])}",
      f"  peak (XLA)                    {_gb(up['memory']['peak'])}      "
      f"{_gb(dec['memory']['peak'])}"
      + ("   exceeds HBM" if max(up['memory']['peak'], dec['memory']['peak']) > hw.hbm_bytes
         else ""),
      f"  read per decode step (weights, KV)               "
      f"{_gb(dec['weights_read'] + dec['kv_cache'])}"
      f"  (XLA:CPU's bytes: {dec['xla']['bytes_accessed'] / 1e9:.2f} GB)",
      f"  FLOPs, analytic               {up['flops']:11.3e}      {dec['flops']:11.3e}",
      f"  FLOPs, XLA cost_analysis      {up['xla']['flops']:11.3e}      "
      f"{dec['xla']['flops']:11.3e}  (the loop body counted once;"
      f" x{b['completion_len']}: {dec['xla']['flops'] * b['completion_len']:.3e})",
  ]
  for name, part in (("update step", up), ("decode loop", dec)):
    summary = summarise_collectives(part["collectives"])
    for kind, s in sorted(summary.items()):
      lines.append(f"  {name} {kind:<19s} x{s['count']:<7d} {s['bytes'] / 1e9:9.3f} GB, "
                   f"{s['wire_bytes'] / 1e9:9.3f} GB on the wire")
  u, d = est["update"], est["decode"]
  t = lambda x: f"{x:10.3g}"
  lines += [
      "",
      "estimated seconds            compute     memory  collectives      total",
      f"  update step            {t(u['compute'])} {t(u['memory'])}   {t(u['collectives'])} "
      f"{t(u['total'])}",
      f"  decode loop            {t(d['compute'])} {t(d['memory'])}   {t(d['collectives'])} "
      f"{t(d['total'])}",
      f"  prefill (analytic)     {t(est['prefill'])}",
      f"  weight sync to sampler {t(est['sync'])}",
      f"  GRPO step: train {est['train']:.3g} s, sample {est['sample']:.3g} s, "
      f"step {est['step']:.3g} s"
      + (" (train and sample overlap: own devices, rl.max_staleness >= 1)"
         if est["overlapped"] else " (train, then sample)"),
  ]
  return "\n".join(lines)


def run_worker(args: Mapping) -> dict:
  config = config_lib.load_config(args["config"], args["overrides"])
  prompt_len = args["prompt_len"] or int(config.get("plan", {}).get("prompt_len", 256))
  sampler = args["sampler_mesh"] if args["sampler_mesh"] is not None else config.sampler_mesh
  return analyse(config, args["devices"], args["mesh"], sampler, prompt_len)


def plan(config_spec: str, overrides: Sequence[str], devices: str, mesh: str,
         sampler_mesh: str | None = None, hardware: str | None = None,
         prompt_len: int = 0, timeout: float = 1800) -> tuple[dict, Hardware, dict]:
  """Runs `analyse` in a subprocess with that many fake CPU devices; returns
  (measurements, hardware, estimate)."""
  count, hw = resolve_devices(devices, hardware)
  sharding.parse_mesh(mesh, "--mesh")
  args = {"config": config_spec, "overrides": list(overrides), "devices": count, "mesh": mesh,
          "sampler_mesh": sampler_mesh, "prompt_len": prompt_len}
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={count}",
             PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
  done = subprocess.run([sys.executable, "-m", "rlcode.plan", json.dumps(args)], env=env,
                        capture_output=True, text=True, timeout=timeout)
  lines = done.stdout.strip().splitlines()
  if done.returncode == 2:  # a BadInput in the worker: its one line
    raise BadInput(done.stderr.strip().splitlines()[-1])
  if done.returncode != 0 or not lines:
    raise RuntimeError(f"rlcode plan worker failed (exit {done.returncode}):\n"
                       f"{done.stderr[-3000:]}")
  result = json.loads(lines[-1])
  return result, hw, estimate(result, hw)


def _worker_main(argv: Sequence[str]) -> int:
  try:
    result = run_worker(json.loads(argv[0]))
  except BadInput as e:
    print(e.message, file=sys.stderr)
    return 2
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(_worker_main(sys.argv[1:]))
