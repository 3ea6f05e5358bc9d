"""Where the default job's supervised warm start stops improving: validation pass@1 of
cross-entropy on the training references, every few steps, for as long as asked.

    python -m experiments.grpo.plateau [--steps 1500] [--every 100] [--seed 0]
        [--out experiments/out/plateau] [--config.a.b=value ...]

Builds the policy of configs/grpo_tiny.py (with the overrides), then trains it on the
references the warm start may use (config.warmstart: its optimizer, batch size and
`reference_share`) for --steps steps with the warm start's learning-rate schedule
stretched over them, and measures pass@1 on the validation split (config.eval's samples)
every --every steps, with the seconds spent training. The held-out split is never read.
Writes OUT/plateau.json (rewritten after each evaluation).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from flax import nnx

from experiments.lib import ROOT, results, runs
from rlcode import optim
from rlcode.config import loader
from rlcode.data import sources
from rlcode.models.build import build_model
from rlcode.parallel import sharding
from rlcode.rl import rollout
from rlcode.policy import sft, warm_start

CONFIG = os.path.join(ROOT, "configs", "grpo_tiny.py")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=1500)
  parser.add_argument("--every", type=int, default=100)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments/out/plateau"))
  args, overrides = parser.parse_known_args()
  config = loader.load_config(CONFIG, [f"--config.seed={args.seed}",
                                       f"--config.warmstart.steps={args.steps}", *overrides])
  mesh = sharding.mesh_from_config(config.mesh)
  job = warm_start.Job.of(config.warmstart, seed=config.seed, model=config.model,
                          data=config.data, rl=config.rl)
  model, tokenizer = build_model(config.model, mesh, job.seed)
  train, _ = rollout.fit_tasks(sources.load(config.data, config.data.train_split), tokenizer,
                               split="train", max_seq_len=model.cfg.max_seq_len,
                               max_new_tokens=config.rl.max_new_tokens,
                               drop_too_long=bool(config.data.drop_too_long))
  tasks, _ = warm_start.warm_start_tasks(job, tokenizer, model.cfg.max_seq_len, train)
  val = sources.load_eval(config.data)
  graphdef, params = nnx.split(model, nnx.Param)
  curve, spent = [], [0.0, time.perf_counter()]
  path = os.path.join(args.out, "plateau.json")

  def on_step(step, params, loss):
    if step % args.every:
      return
    spent[0] += time.perf_counter() - spent[1]
    p1 = runs.pass_at_1(config, nnx.merge(graphdef, params), tokenizer, val, mesh)
    curve.append({"step": step, "train_seconds": spent[0], "loss": float(loss),
                  "val_pass@1": p1})
    print(f"step {step:5d}  {spent[0]:7.1f} s  loss {float(loss):.4f}  val pass@1 {p1:.3f}",
          flush=True)
    results.write_json({"seed": args.seed, "overrides": overrides, "warm_tasks": len(tasks),
                        "curve": curve}, path)
    spent[1] = time.perf_counter()

  ws = config.warmstart  # the warm start's own batches (rlcode.policy.warm_start)
  sft.run(graphdef, params, tasks, tokenizer, mesh,
          optimizer=optim.OptimizerConfig.from_config(ws.optimizer), batch_size=ws.batch_size,
          seed=job.seed + 1, steps=args.steps,
          multiple=config.rl.length_multiple, on_step=on_step)
  print(json.dumps(curve[-1]))


if __name__ == "__main__":
  main()
