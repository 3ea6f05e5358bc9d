"""A diffs/seeds.py run's policies evaluated again, with more samples per task.

    python -m experiments.diffs.reeval OUT [--samples 16] [--seeds 0 1 2]
        [--held-out] [--name NAME] [--config.a.b=v ...]

OUT is a directory experiments/diffs/seeds.py wrote (its --out). For each seed, the
policy right after its warm start (OUT/seedS/warm_start) and after its last GRPO
step (OUT/seedS/checkpoints) are evaluated as the config's eval rows are
(experiments.lib.runs.eval_splits: T=1, the same sampling seed) on the validation
split (and with --held-out the test split) but with --samples answers per task.
A row of 54 tasks x 2 answers, as the config's rows were before 2026-12-03, has
a sampling error of several hundredths, as large as the gain the issue asks
for; this tells whether a gain or a loss in such rows is the policy's or the
draw's. The run's own overrides (in
OUT/grpo_diffs_seeds.json) are applied first, then any given here. Prints a
row per seed and split and the mean ± SE of the gain, and writes
OUT/reeval_n{samples}.json and results/diffs/NAME (default: OUT's name, then
_reeval_n{samples}).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from flax import nnx

from experiments.lib import ROOT, results, runs, stats
from rlcode.config import loader
from rlcode.parallel import sharding

CONFIG = os.path.join(ROOT, "configs", "grpo_diffs.py")
KEYS = runs.DIFF_KEYS


def evaluate_seed(out: str, seed: int, samples: int, held_out: bool,
                  overrides: list[str]) -> dict:
  """{split name: {"warm_start": row, "last": row}} of one seed's two policies."""
  workdir = os.path.join(out, f"seed{seed}")
  config = loader.load_config(CONFIG, overrides + [
      f"--config.seed={seed}", f"--config.eval.num_samples={samples}",
      f"--config.data.test_split={'test' if held_out else 'None'}",
      "--config.train.progress_bar=false"])
  names = {"eval": config.data.eval_split, "test": config.data.test_split}
  mesh = sharding.mesh_from_config(config.mesh)
  result = {}
  for name, path in (("warm_start", os.path.join(workdir, "warm_start")), ("last", workdir)):
    model, tokenizer, step, _ = runs.restore_policy(config, path, mesh)
    graphdef, params = nnx.split(model, nnx.Param)
    start = time.time()
    for split, row in runs.eval_splits(config, graphdef, params, tokenizer, mesh,
                                       KEYS).items():
      result.setdefault(names[split], {})[name] = {"step": step, **row}
    result["seconds"] = result.get("seconds", 0.0) + time.time() - start
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("out")
  parser.add_argument("--samples", type=int, default=16)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--held-out", action="store_true", help="the test split as well")
  parser.add_argument("--name", default=None, help="the result's name under results/diffs/")
  args, extra = parser.parse_known_args()
  for item in extra:
    if not item.startswith("--config."):
      parser.error(f"unknown argument {item!r}")
  with open(os.path.join(args.out, "grpo_diffs_seeds.json")) as f:
    overrides = json.load(f)["overrides"] + extra
  found = {seed: evaluate_seed(args.out, seed, args.samples, args.held_out, overrides)
           for seed in args.seeds}
  for split in ["validation"] + (["test"] if args.held_out else []):
    print(f"\n{split}, {args.samples} samples a task: warm start -> last (reward gain)")
    gains = []
    for seed, run in found.items():
      w, last = run[split]["warm_start"], run[split]["last"]
      gains.append(last["diff/reward_mean"] - w["diff/reward_mean"])
      print(f"  seed {seed}: format valid {w['diff/format_valid']:.3f} -> "
            f"{last['diff/format_valid']:.3f}, reward {w['diff/reward_mean']:.3f} -> "
            f"{last['diff/reward_mean']:.3f} ({gains[-1]:+.3f})")
    mean, se = stats.mean_se(gains)
    print(f"  reward gain: {mean:+.3f} ± {se:.3f}")
  payload = {"samples": args.samples, "overrides": overrides, "runs": found}
  path = os.path.join(args.out, f"reeval_n{args.samples}.json")
  results.write_json(payload, path)
  name = args.name or f"{os.path.basename(os.path.normpath(args.out))}_reeval_n{args.samples}"
  print(f"wrote {path} and {results.write('diffs', name, payload)}")


if __name__ == "__main__":
  main()
