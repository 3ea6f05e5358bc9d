"""Packed batches against padded ones: the GRPO update's trained tokens per second.

    python -m experiments.speed.packing [--groups 8] [--group 8] [--prompt 64] [--budget 256]
        [--median 32] [--pack-tokens 256] [--repeats 3] [--seed 0]

The 10M-parameter Qwen2-style model of experiments/speed/engine_rollouts.py (random weights,
float32), `--groups` prompts of `--prompt` tokens with `--group` completions each, whose
lengths are log-normal (sigma 1) with median `--median` and cut at `--budget` (the mix of
engine_rollouts.py: median 1/8 of the budget). One update step (forward, backward, AdamW;
rlcode.rl.grpo.make_update_step) on the same batch in two layouts, side by side in one
run: the shared prompt with every completion padded to the longest (the default,
rlcode.rl.shared_prefix) and the same with each group's completions packed into rows of
`--pack-tokens` (rlcode.rl.packing). Each step is timed as the best of `--repeats` after
a compiling call; both steps give the same loss (checked). Prints the positions each
computes, its padding, seconds, trained tokens per second and their ratio; writes
results/speed/packing.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
from flax import nnx

from experiments.lib import results
from experiments.lib.timing import best_time
from experiments.speed.engine_rollouts import CFG, lengths_mix
from rlcode import optim
from rlcode.models import Decoder
from rlcode.parallel import sharding
from rlcode.rl import grpo, objective, packing, shared_prefix

TARGET = 1.5


def batches(args):
  """The same rollout in both layouts."""
  rng = np.random.default_rng(args.seed)
  prompts = [rng.integers(1, CFG.vocab_size, args.prompt).tolist() for _ in range(args.groups)]
  lengths = lengths_mix(rng, args.groups * args.group, args.median, args.budget)
  completions = [rng.integers(1, CFG.vocab_size, int(n)).tolist() for n in lengths]
  old = [np.full(int(n), -8.0, np.float32) for n in lengths]
  adv = rng.normal(size=len(completions)).astype(np.float32)
  width = min(-(-int(lengths.max()) // 32) * 32, args.budget)
  common = dict(pad_id=0, completion_len=width, old_logp=old, adv=adv)
  return lengths, {
      "padded": shared_prefix.grouped_batch(prompts, completions, **common),
      "packed": packing.packed_batch(prompts, completions, pack_tokens=args.pack_tokens,
                                     **common)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--groups", type=int, default=8)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--budget", type=int, default=256)
  parser.add_argument("--median", type=int, default=32)
  parser.add_argument("--pack-tokens", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  lengths, layouts = batches(args)
  trained = int(lengths.sum())
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  graphdef, _ = nnx.split(model, nnx.Param)
  optimizer = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-4, warmup_steps=1,
                                                         decay_steps=100))
  loss_cfg = objective.LossConfig(max_completion_len=args.budget)
  fns = {"padded": shared_prefix.logprob_fn(1.0), "packed": packing.logprob_fn(1.0)}
  rows = {}
  for name, batch in layouts.items():
    state = jax.tree.map(lambda x: x.copy(), optim.init_state(model, optimizer, mesh))
    update = grpo.make_update_step(graphdef, optimizer, loss_cfg, mesh, state, batch,
                                   logprob_fn=fns[name])
    compiled = update.lower(state, batch).compile()
    holder = {"state": state, "first_loss": None}

    def run(compiled=compiled, batch=batch, holder=holder):
      holder["state"], metrics = compiled(holder["state"], batch)
      if holder["first_loss"] is None:
        holder["first_loss"] = float(metrics["loss"])
      return metrics["loss"]
    seconds = best_time(run, args.repeats)
    rows[name] = {**packing.padding(batch), "seconds": seconds,
                  "trained_tokens_per_s": trained / seconds,
                  "first_loss": holder["first_loss"]}
  a, b = rows["padded"], rows["packed"]
  assert abs(a["first_loss"] - b["first_loss"]) <= 1e-5 * max(abs(a["first_loss"]), 1e-6), rows
  ratio = b["trained_tokens_per_s"] / a["trained_tokens_per_s"]
  print(f"{args.groups} groups x {args.group}, prompt {args.prompt}, completions log-normal "
        f"median {args.median} cut at {args.budget} (mean {lengths.mean():.1f}, longest "
        f"{lengths.max()}), {trained} trained tokens; packs of {args.pack_tokens}")
  print("| layout | positions computed | padding | seconds a step | trained tokens/s |")
  print("|---|---:|---:|---:|---:|")
  for name, r in rows.items():
    print(f"| {name} | {r['update_computed_tokens']} | {r['update_padding_frac']:.0%} | "
          f"{r['seconds']:.2f} | {r['trained_tokens_per_s']:.0f} |")
  print(f"packed / padded: {ratio:.2f}x (target {TARGET}x)")
  print("wrote", results.write("speed", "packing", {
      "args": vars(args), "trained_tokens": trained, "lengths": lengths.tolist(),
      "layouts": rows, "ratio": ratio, "target": TARGET}))


if __name__ == "__main__":
  main()
