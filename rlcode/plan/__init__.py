"""`rlcode plan`: what a config needs per device on hardware we do not have, without running it.

    rlcode plan --config configs/qwen2_7b_plan.py --devices gb200-nvl72 \
        --mesh data=8,fsdp=8 --sampler-mesh data=2,tensor=4
    rlcode plan --config configs/grpo_tiny.py --devices 72 --mesh data=9,fsdp=8 --hardware h200

For N devices (a count, or a system from SYSTEMS), a subprocess started with
--xla_force_host_platform_device_count=N (so the caller's own devices do not matter)
lowers and compiles, with abstract parameters (jax.ShapeDtypeStruct: nothing of model
size is ever allocated):
  * the update step train.py runs (forward, backward and optimiser, one SPMD program
    over the trainer's mesh), for the config's batch (rl.prompts_per_step x
    rl.group_size rows, prompts of --prompt-len tokens, rl.max_new_tokens completions);
  * one inference engine's decode step (the decode program of rlcode.engine.programs,
    what each engine step runs) for one data shard of the sampler's mesh
    (config.sampler_mesh or --sampler-mesh on the devices after the trainer's, else the
    trainer's mesh): its tensor devices, a pool of pages sized for the shard's live tokens at the end of
    sampling (rlcode.plan.sampler), pages of serve.page_size's default positions.
It prints per device: memory (parameters, optimiser state and the engine's pool by our
own accounting from the shardings, the pool's bytes per live token against the tokens'
own; activations and temporaries, and the peak, from compiled.memory_analysis()), FLOPs
(an analytic count next to XLA's cost_analysis, which counts a while loop's body once),
the collectives of the optimised HLO with their bytes (a loop body's counted once per
iteration), and an estimated time from the hardware's published peaks. A mesh that does not divide the model (heads, KV
heads, layers, hidden size, MLP width or vocabulary on the mesh axes the sharding rules
map them to) or the batch is refused with one line (rlcode.errors.BadInput).

What the numbers are not: XLA:CPU compiles these programs, so fusion, activation
buffers and collective choices are the CPU compiler's, not XLA:GPU's; the attention
kernels are the CPU ones (blockwise and paged XLA), not Pallas or cuDNN; with no bfloat16
matmul, XLA:CPU keeps float32 copies of bfloat16 weights and of the pages a step reads,
most of an engine step's temporaries. Parameters, optimiser state, KV pool, FLOPs and
collective bytes follow from the shardings and hold on any backend; activation memory and
the time estimate are first-order.

This package must not allocate a model, run a step, or import the data pipeline.

  hardware.py  the GPUs' published peaks and the systems (h200x8, gb200-nvl72)
  flops.py     analytic FLOP counts of the update, prefill and decoding
  hlo.py       the collectives of optimised HLO, their bytes on the wire and time
  sampler.py   one engine's pool of pages for its share of the batch, its decode step compiled
  analysis.py  compile the update and the engine's step abstractly, read XLA's analyses; the estimate
  report.py    the printed table
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from rlcode.config import loader
from rlcode.parallel import sharding
from rlcode.errors import BadInput
from rlcode.plan.analysis import analyse, estimate
from rlcode.plan.flops import decode_flops, forward_flops, prefill_flops, update_flops
from rlcode.plan.hardware import GPUS, SYSTEMS, Hardware, resolve_devices
from rlcode.plan.hlo import collective_seconds, collectives, summarise_collectives, wire_bytes
from rlcode.plan.report import format_table

__all__ = ["GPUS", "SYSTEMS", "Hardware", "analyse", "collective_seconds", "collectives",
           "decode_flops", "estimate", "format_table", "forward_flops", "plan", "prefill_flops",
           "resolve_devices", "run_worker", "summarise_collectives", "update_flops",
           "wire_bytes"]


def run_worker(args: Mapping) -> dict:
  config = loader.load_config(args["config"], args["overrides"])
  prompt_len = args["prompt_len"] or config.plan.prompt_len
  sampler = args["sampler_mesh"] if args["sampler_mesh"] is not None else config.sampler_mesh
  return analyse(config, args["devices"], args["mesh"], sampler, prompt_len,
                 args["page_size"])


def plan(config_spec: str, overrides: Sequence[str], devices: str, mesh: str,
         sampler_mesh: str | None = None, hardware: str | None = None,
         prompt_len: int = 0, timeout: float = 1800,
         page_size: int | None = None) -> tuple[dict, Hardware, dict]:
  """Runs `analyse` in a subprocess with that many fake CPU devices; returns
  (measurements, hardware, estimate). The engine's pages hold `page_size` positions
  (None: serve.page_size's default)."""
  count, hw = resolve_devices(devices, hardware)
  sharding.parse_mesh(mesh, "--mesh")
  args = {"config": config_spec, "overrides": list(overrides), "devices": count, "mesh": mesh,
          "sampler_mesh": sampler_mesh, "prompt_len": prompt_len, "page_size": page_size}
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
