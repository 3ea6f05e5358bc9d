"""Which bits of the default job depend on the machine: digests to compare across machines.

    python -m experiments.grpo.numerics [--steps 40]
    taskset -c 0 python -m experiments.grpo.numerics       # the same, one visible core
    XLA_FLAGS=--xla_cpu_max_isa=AVX2 python -m experiments.grpo.numerics

Prints the CPU model, the cores the process may use, XLA_FLAGS, and sha256 digests of
(1) a float32 sum of 2**20 numbers, a dot and a gradient through it, and (2) the parameters
after the default job's warm start (configs/grpo_tiny.py, seed 0) of `--steps` steps.
Two runs whose digests match computed the same bits.

What it shows on this project's machines (docs/results.md, "What reproduces"): XLA:CPU
splits a large reduction into as many parallel tasks as the process has schedulable cores,
which changes the order of its float additions; the dot (Eigen) does not change. So the
bits depend on the number of cores the process may use and on the instruction set (SSE4.2,
without FMA, differs from AVX2; AVX2 equals AVX-512), not on the load.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlcode.config import loader
from rlcode.data import sources
from rlcode.models.build import build_model
from rlcode.parallel import sharding
from rlcode.policy import warm_start
from rlcode.rl import rollout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def digest(*arrays) -> str:
  return hashlib.sha256(b"".join(np.asarray(a).tobytes() for a in arrays)).hexdigest()[:16]


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or "unknown"


def probes() -> dict[str, str]:
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.normal(size=(512, 768)), jnp.float32)
  b = jnp.asarray(rng.normal(size=(768, 1024)), jnp.float32)
  x = jnp.asarray(rng.normal(size=(1 << 20,)), jnp.float32)
  grad = jax.jit(jax.grad(lambda a, b: jnp.sum(jnp.tanh(a @ b))))
  return {"sum": digest(jax.jit(jnp.sum)(x)), "dot": digest(jax.jit(jnp.matmul)(a, b)),
          "grad": digest(grad(a, b))}


def warm_start_digest(steps: int) -> tuple[str, float]:
  config = loader.resolve(loader.load_config(
      os.path.join(ROOT, "configs", "grpo_tiny.py"),
      [f"--config.warmstart.steps={steps}", "--config.seed=0"]))
  mesh = sharding.make_mesh()
  job = warm_start.Job.of(config.warmstart, seed=config.seed, model=config.model,
                          data=config.data, rl=config.rl, progress=config.train.progress_bar)
  model, tok = build_model(config.model, mesh, job.seed)
  train = sources.load(config.data, config.data.train_split)
  train, _ = rollout.fit_tasks(train, tok, split="train", max_seq_len=model.cfg.max_seq_len,
                               max_new_tokens=config.rl.max_new_tokens, drop_too_long=False)
  graphdef, params = nnx.split(model, nnx.Param)
  tasks, _ = warm_start.warm_start_tasks(job, tok, model.cfg.max_seq_len, train)
  start = time.time()
  params = warm_start.warm_start(job, graphdef, params, tasks, tok, mesh,
                                 lambda *a, **k: None)
  return digest(*jax.tree.leaves(jax.device_get(params))), time.time() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=40, help="warm-start steps (0: skip)")
  args = parser.parse_args()
  print(f"cpu: {cpu_model()}; cores the process may use: {len(os.sched_getaffinity(0))}; "
        f"XLA_FLAGS: {os.environ.get('XLA_FLAGS', '')!r}; jax {jax.__version__}")
  print("probes:", " ".join(f"{k} {v}" for k, v in probes().items()))
  if args.steps:
    value, seconds = warm_start_digest(args.steps)
    print(f"warm start of {args.steps} steps: {value} ({seconds:.1f} s)")


if __name__ == "__main__":
  main()
