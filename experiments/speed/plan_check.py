"""How far off is `rlcode plan`'s time estimate? Checked against measured steps on this CPU.

    python -m experiments.speed.plan_check [--repeats 5] [--out DIR] [--config.a.b=value ...]

1. This machine's peaks, measured: FLOP/s of a float32 2048 x 2048 matmul and memory
   bandwidth of an elementwise pass over 512 MB (best of --repeats each), on one CPU
   device (XLA's thread pool over all cores).
2. rlcode.plan.analyse for one device with those peaks (Hardware "cpu-measured").
3. The same programs run for real: the update step on a random batch of the planned
   shape and generate() of the planned rows (prefill and the decode loop), median of
   --repeats after one compiling call.

The model is configs/grpo_tiny.py widened (hidden 512, 4 layers, SwiGLU 1408, 8 heads
of 64, float32) so that arithmetic, not per-op overhead, has a chance to dominate; the
batch is 4 prompts x 8 samples, 128-token prompts, 64-token completions. Prints the
estimate's terms, the measurement and their ratio; writes result.json to --out (default
results/speed/plan_check).
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.lib import ROOT, results
from experiments.lib.timing import best_time, median_time
from rlcode import optim, plan, sampling
from rlcode.config import loader
from rlcode.models.build import build_model
from rlcode.parallel import sharding
from rlcode.rl import algorithm, shared_prefix

CONFIG = os.path.join(ROOT, "configs", "grpo_tiny.py")
WIDE = ["--config.model.arch.hidden_size=512", "--config.model.arch.intermediate_size=1408",
        "--config.model.arch.num_layers=4", "--config.model.arch.num_heads=8",
        "--config.model.arch.num_kv_heads=4", "--config.model.arch.head_dim=64",
        "--config.rl.prompts_per_step=4", "--config.rl.group_size=8",
        "--config.rl.max_new_tokens=64", "--config.rl.num_passes=1", "--config.rl.log_kl=false"]
PROMPT_LEN = 128


def measured_peaks(repeats):
  """(FLOP/s of a float32 2048 x 2048 matmul, bytes/s of an elementwise pass over 512 MB)."""
  n = 2048
  a = jnp.ones((n, n), jnp.float32)
  matmul = jax.jit(lambda x: x @ x)
  flops = 2 * n ** 3 / best_time(lambda: matmul(a).block_until_ready(), repeats)
  big = jnp.ones((128 * 1024 * 1024,), jnp.float32)  # 512 MB, read once and written once
  add = jax.jit(lambda x: x + 1.0)
  bandwidth = 2 * big.nbytes / best_time(lambda: add(big).block_until_ready(), repeats)
  return flops, bandwidth


def measured_steps(config, repeats):
  """Median seconds of the planned update step and of generate() of the planned rows."""
  rl = config.rl
  mesh = sharding.make_mesh(1, 1, 1)
  model, _ = build_model(config.model, mesh, config.seed)
  graphdef, _ = nnx.split(model, nnx.Param)
  optimizer = optim.make_optimizer(optim.OptimizerConfig.from_config(config.optimizer))
  state = optim.init_state(model, optimizer, mesh)
  p, n, tc = rl.prompts_per_step, rl.prompts_per_step * rl.group_size, rl.max_new_tokens
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(3, 200, PROMPT_LEN)) for _ in range(p)]
  completions = [list(rng.integers(3, 200, tc)) for _ in range(n)]
  batch = shared_prefix.grouped_batch(prompts, completions, pad_id=0, completion_len=tc,
                                      adv=rng.normal(size=n).astype(np.float32))
  update = shared_prefix.update_step(graphdef, optimizer,
                                     algorithm.loss(rl, tc), mesh, state,
                                     shared_prefix.GroupedBatch.abstract(p, n))
  holder = [state]

  def one_update():
    """One update step, fed the state the last one returned."""
    holder[0], m = update(holder[0], batch)
    jax.block_until_ready(m)

  update_s = median_time(one_update, repeats)
  policy = nnx.merge(graphdef, holder[0].params)
  # No stop token: every row decodes the whole budget, as the plan assumes.
  sample = lambda: sampling.generate(policy, prompts, max_new_tokens=tc, group_size=rl.group_size,
                                     temperature=1.0, seed=0, mesh=mesh)
  return update_s, median_time(sample, repeats)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--out", default=None,
                      help="the result's folder (default results/speed/plan_check)")
  args, overrides = parser.parse_known_args()
  config = loader.load_config(CONFIG, WIDE + overrides)
  flops, bandwidth = measured_peaks(args.repeats)
  hw = plan.Hardware("cpu-measured", flops, bandwidth, 24e9, bandwidth, 1)
  result = plan.analyse(config, 1, "data=1", "", PROMPT_LEN)
  est = plan.estimate(result, hw)
  update_s, sample_s = measured_steps(config, args.repeats)
  rows = [("update step", est["update"], update_s),
          ("sample (prefill + decode)",
           {**est["decode"], "total": est["decode"]["total"] + est["prefill"]}, sample_s)]
  print(f"CPU peaks (measured, {jax.device_count()} device, {os.cpu_count()} cores): "
        f"{flops / 1e9:.1f} GFLOP/s float32 matmul, {bandwidth / 1e9:.1f} GB/s")
  print(f"model: {result['model']['parameters'] / 1e6:.1f}M parameters; batch "
        f"{result['batch']['rows']} rows, prompt {PROMPT_LEN}, completion "
        f"{result['batch']['completion_len']}")
  print(f"{'':26s} {'compute':>8s} {'memory':>8s} {'estimate':>9s} {'measured':>9s} "
        f"{'measured/estimate':>17s}")
  for name, e, m in rows:
    print(f"{name:26s} {e['compute']:8.3f} {e['memory']:8.3f} {e['total']:9.3f} {m:9.3f} "
          f"{m / e['total']:17.2f}")
  print("wrote", results.write("speed", "plan_check", {
      "flops": flops, "bandwidth": bandwidth, "estimate": est,
      "measured": {"update": update_s, "sample": sample_s},
      "xla": {"update": result["update"]["xla"], "decode": result["decode"]["xla"]},
      "analytic_flops": {"update": result["update"]["flops"],
                         "decode": result["decode"]["flops"]}}, config=config, into=args.out))


if __name__ == "__main__":
  main()
