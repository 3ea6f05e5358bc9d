"""Compiling a config's update step and the engine's decode step on fake devices; the estimate.

`analyse` runs in the worker process that has the devices (rlcode.plan.plan starts it);
nothing of model size is allocated: the programs are lowered from abstract parameters.

The estimate, per device and per program: compute time = FLOPs / peak dense bf16
FLOP/s (for the update, the larger of the analytic share and XLA's count, which sees
work the mesh repeats on several devices); memory time = bytes / HBM bandwidth (XLA's
bytes accessed for the update; for decoding, each of the completion's steps reads the
engine's weights (split over tensor alone; the embedding table counted whole, though a
lookup reads only its rows) and the device's part of every row's pages up to its length,
a prompt's shared pages once per row, as the paged attention kernels walk them. XLA:CPU's
bytes accessed for a step, every operand of every op, are printed, not used);
collective time = bytes on the wire / link bandwidth (ring algorithms: an all-gather or
reduce-scatter of S bytes over g devices moves S (g - 1) / g per device, an all-reduce
twice that; NVLink within a domain, the network beyond; a decode step's once per
step). time = max(compute, memory)
+ collectives: no overlap of communication with computation, so an upper bound for a
well-overlapped program. One GRPO step = rl.num_passes updates + a proximal or
reference forward when the config needs one (1/3 of an update's FLOPs) + prefill
(analytic, compute-bound) + decoding + one weight sync when the sampler has its own
devices.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from rlcode.config import serving
from rlcode import optim
from rlcode.models import build, hub, lora
from rlcode.models import hf_config as model_cfg_lib
from rlcode.models.decoder import Decoder
from rlcode.rl import algorithm, grpo, sequences, shared_prefix
from rlcode.parallel import sharding
from rlcode.errors import BadInput
from rlcode.plan import flops
from rlcode.plan import hardware
from rlcode.plan import hlo
from rlcode.plan import sampler as sampler_lib


def model_config(model_cfg):
  """The ModelConfig of a model section, config.model (from-scratch arch, or a checkpoint's
  config.json)."""
  if model_cfg.hf_path:
    overrides = build.model_overrides(model_cfg)
    path = os.path.join(hub.resolve(model_cfg.hf_path), "config.json")
    return model_cfg_lib.from_hf_config(model_cfg_lib.read_hf_config(path), source=path,
                                        **overrides)
  return build.model_config(model_cfg)


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
  """Device bytes of a compiled program (XLA's memory analysis), and those in host memory
  (offloaded optimiser state and activations), which are not in the device's peak."""
  m = compiled.memory_analysis()
  host = lambda name: int(getattr(m, "host_" + name, 0) or 0)
  return {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
          "temporaries": m.temp_size_in_bytes, "aliased": m.alias_size_in_bytes,
          "peak": (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                   - m.alias_size_in_bytes),
          "host": (host("argument_size_in_bytes") + host("output_size_in_bytes")
                   + host("temp_size_in_bytes") - host("alias_size_in_bytes"))}


def _offloaded(memory: dict, host_bytes: int, params_and_grads: int) -> dict:
  """The update's memory with `host_bytes` of optimiser state in host memory. Where XLA
  keeps no separate host space (the CPU backend the planner compiles on), the state is in
  its arguments: take it out of the peak, and bound the optimiser step, which brings the
  moments to the device beside the parameters and gradients and writes new ones, by
  parameters + gradients + twice the state."""
  if not host_bytes or memory["host"]:
    return memory
  peak = max(memory["peak"] - host_bytes, params_and_grads + 2 * host_bytes)
  return {**memory, "xla_peak": memory["peak"], "peak": peak, "host": host_bytes,
          "host_estimated": True}


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return {"flops": float(cost.get("flops", 0.0)),
          "bytes_accessed": float(cost.get("bytes accessed", 0.0))}


# The programs are compiled, never run: LLVM's optimisations only cost time here (buffer
# assignment, memory analysis and HLO cost analysis come before them).
COMPILE_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def analyse(config, devices: int, mesh_spec: str, sampler_spec: str, prompt_len: int,
            page_size: int | None = None) -> dict:
  """Compiles the update step and one engine's decode step (pages of `page_size`
  positions; None: serve.page_size's default) for this process's devices (which must be
  at least `devices`); returns the measurements (no estimate: see `estimate`)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec as P


  page_size = serving.Serve().page_size if page_size is None else page_size
  if page_size < 1:
    raise BadInput(f"page_size={page_size}: a page holds at least 1 position")
  rl = config.rl
  cfg = model_config(config.model)
  sizes = sharding.parse_mesh(mesh_spec, "--mesh")
  n_train = math.prod(sizes.values())
  sampler_sizes = sharding.parse_mesh(sampler_spec, "--sampler-mesh") if sampler_spec else None
  n_sample = math.prod(sampler_sizes.values()) if sampler_sizes else 0
  if n_train + n_sample > devices:
    raise BadInput(f"--mesh {mesh_spec!r}" + (f" and --sampler-mesh {sampler_spec!r}"
                                               if sampler_spec else "")
                   + f" need {n_train + n_sample} devices; --devices gives {devices}")
  all_devices = jax.devices()[:devices]
  mesh = sharding.make_mesh(**sizes,
                            devices=all_devices[:n_train])
  sampler_mesh = (sharding.make_mesh(**sampler_sizes,
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
  opt_cfg = optim.OptimizerConfig.from_config(config.optimizer)
  optimizer = optim.make_optimizer(opt_cfg)
  trainable = lora.trainable(cfg)
  train_params, _ = optim.split_trainable(params, trainable)
  replicated = NamedSharding(mesh, P())
  opt_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                           jax.eval_shape(optimizer.init, train_params),
                           optim.opt_state_shardings(optimizer, train_params, mesh,
                                                     opt_cfg.offload))
  state = optim.TrainState(params=params, opt_state=opt_state,
                          step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated))
  loss_cfg = algorithm.loss(rl, rl.max_new_tokens)
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
    example = sequences.SequenceBatch(tokens=i32(rows, prompt_len + tc), start=i32(rows),
                                 mask=f32(rows, tc), old_logp=f32(rows, tc),
                                 ref_logp=f32(rows, tc), adv=f32(rows), weight=f32(rows, tc))
    logprob_fn = None
  batch = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       example, optim.batch_shardings(mesh, example))
  update = grpo.make_update_step(
      graphdef, optimizer, loss_cfg, mesh, state, example, logprob_fn=logprob_fn,
      micro_batch_rows=rl.micro_batch_rows, trainable=trainable, offload=opt_cfg.offload
  ).lower(state, batch).compile(COMPILE_OPTIONS)

  # One engine's decode step (rlcode.plan.sampler) on the model an engine samples with
  # (Decoder.for_sampling: looped, adapters folded in).
  sample_cfg = cfg.replace(scan_layers=False, remat="none", lora=None,
                           param_dtype=(cfg.lora.base_dtype if cfg.lora and cfg.lora.base_dtype
                                        else cfg.param_dtype))
  full_graphdef, full_state = nnx.split(
      nnx.eval_shape(lambda: Decoder(sample_cfg, rngs=nnx.Rngs(0))))
  tensor = sampler_mesh.shape["tensor"]
  pool = sampler_lib.engine_pool(prompts, group, prompt_len, tc,
                                 (n_sample or n_train) // tensor, page_size)
  decode, sampler_state, pools = sampler_lib.compile_decode(
      sample_cfg, full_graphdef, full_state, sampler_mesh, pool, COMPILE_OPTIONS)
  pool_bytes = _shard_bytes(pools)
  token_bytes = pool_bytes / (pool.pages * pool.page_size)
  forward, train_flops, recompute = flops.update_flops(cfg, prompts, rows, prompt_len, tc,
                                                      rl.shared_prefix)
  host_optimizer = _shard_bytes(opt_state) if opt_cfg.offload else 0
  return {
      "model": {"parameters": cfg.num_params(), "layers": cfg.num_layers,
                "hidden": cfg.hidden_size, "heads": cfg.num_heads,
                "kv_heads": cfg.num_kv_heads, "vocab": cfg.vocab_size,
                "param_dtype": cfg.param_dtype, "dtype": cfg.dtype},
      "fit": {"remat": cfg.remat, "scan_layers": cfg.scan_layers,
              "logits_chunk": cfg.logits_chunk, "micro_batch_rows": rl.micro_batch_rows,
              "context": sizes["context"], "optimizer_offload": bool(opt_cfg.offload),
              "lora_rank": cfg.lora.rank if cfg.lora is not None else None,
              "trained_parameters": sum(math.prod(x.shape)
                                        for x in jax.tree.leaves(train_params))},
      "batch": {"prompts": prompts, "rows": rows, "prompt_len": prompt_len,
                "completion_len": tc, "shared_prefix": bool(rl.shared_prefix),
                "num_passes": rl.num_passes, "max_staleness": rl.max_staleness,
                "extra_forward": bool(loss_cfg.uses_reference or rl.max_staleness > 0)},
      "mesh": sharding.format_mesh(dict(mesh.shape)), "mesh_devices": n_train,
      "sampler_mesh": sharding.format_mesh(dict(sampler_mesh.shape)),
      "sampler_devices": n_sample or n_train, "split": bool(sampler_sizes),
      "update": {
          "parameters": _shard_bytes(params),
          "optimizer": _shard_bytes(opt_state) - host_optimizer,
          "optimizer_on_host": host_optimizer,
          "memory": _offloaded(_memory(update), host_optimizer,
                               _shard_bytes(params) + _shard_bytes(train_params)),
          "xla": _cost(update),
          "flops": train_flops / n_train, "forward_flops": forward / n_train,
          "recompute_flops": recompute / n_train,
          "collectives": hlo.collectives(update.as_text(), devices)},
      "decode": {
          "parameters": _shard_bytes(sampler_state),
          "weights_read": _decode_weight_bytes(sampler_state, sampler_mesh),
          "kv_cache": pool_bytes, "kv_live": pool.live_tokens * token_bytes,
          # Each row reads its own pages through its page table, a prompt's shared pages
          # once per row: on average a row holds its prompt and half its completion.
          "kv_read": pool.rows * (prompt_len + (tc - 1) / 2) * token_bytes,
          "pool": dataclasses.asdict(pool), "engine_devices": tensor,
          "memory": _memory(decode), "xla": _cost(decode),
          "flops": flops.decode_flops(cfg, pool.rows, prompt_len, tc) / tensor,
          "prefill_flops": flops.prefill_flops(cfg, prompts, prompt_len) / (n_sample or n_train),
          "collectives": hlo.collectives(decode.as_text(), devices)},
      "full_params_bytes": cfg.num_params() * jnp.dtype(cfg.jnp_param_dtype).itemsize,
  }


def estimate(result: Mapping, hw: hardware.Hardware) -> dict:
  """Seconds per program and per GRPO step from `analyse`'s measurements."""
  up, dec, b = result["update"], result["decode"], result["batch"]
  # The update has no loop, so XLA's count is whole; it exceeds the analytic share of a
  # device where the mesh does not divide the work (a prompt computed on several devices).
  update = {"compute": max(up["flops"], up["xla"]["flops"]) / hw.flops,
            "memory": up["xla"]["bytes_accessed"] / hw.hbm_bytes_per_s,
            "collectives": hlo.collective_seconds(up["collectives"], hw)}
  update["total"] = max(update["compute"], update["memory"]) + update["collectives"]
  # Every generated token is one engine step: the weights and the rows' pages read once.
  steps = b["completion_len"]
  decode = {"compute": dec["flops"] / hw.flops,
            "memory": steps * (dec["weights_read"] + dec["kv_read"]) / hw.hbm_bytes_per_s,
            "collectives": steps * hlo.collective_seconds(dec["collectives"], hw)}
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
