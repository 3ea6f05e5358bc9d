"""configs/grpo_diffs.py over seeds: the learning curve, the held-out result, a CE control.

    python -m experiments.diffs.seeds [--seeds 0 1 2] [--out DIR] [--name NAME]
        [--no-control] [--no-held-out] [--config.a.b=v ...]

For each seed, in this one process, one after another:
1. `rlcode.train.grpo_loop.train` on configs/grpo_diffs.py with `--config.seed=S`,
   `--config.data.test_split=test` and a warm-start cache under --out: the
   warm start, the step-0 evaluation, the GRPO steps with periodic evaluation
   on the validation split (the split the config was tuned on), and the test
   split evaluated at the warm start and after the last step (its one look;
   --no-held-out leaves it alone, for probes that choose between settings).
2. The cross-entropy control: the same warm start (loaded from the cache)
   trained on with supervised steps for as long as the GRPO steps took
   (sampling, reward and update seconds; experiments.lib.runs), then
   evaluated the same way on both splits. --no-control skips it (its columns
   then read "-").

Prints a table per split (per seed, and the mean with its standard error over
seeds). The runs and grpo_diffs_seeds.json (rewritten as seeds finish; diffs/reeval.py
reads its overrides) stay under --out (default experiments/out/grpo_diffs_seeds); the
result, that JSON and grpo_diffs_seeds.png (validation reward and format validity
against step, one line per seed), goes to results/diffs/NAME (default
grpo_diffs_seeds). Wall-clock, process CPU time and the
machine's load average are recorded per seed: on a shared machine the
wall-clock says little about the run, the CPU time more.
"""

from __future__ import annotations

import os
import time

from experiments.lib import ROOT, heldout, plots, results, runs, stats, tables
from rlcode.config import loader
from rlcode.runs.metrics import read_metrics
from rlcode.train import grpo_loop

CONFIG = os.path.join(ROOT, "configs", "grpo_diffs.py")
KEYS = runs.DIFF_KEYS


def _pick(row: dict, prefix: str) -> dict:
  return {k: row[f"{prefix}/{k}"] for k in KEYS}


def run_seed(seed: int, out: str, overrides: list[str], control: bool = True,
             held_out: bool = True) -> dict:
  """One seed: GRPO with its evaluations, then the cross-entropy control (module docstring)."""
  workdir = os.path.join(out, f"seed{seed}")
  tuning = overrides + [
      f"--config.seed={seed}", f"--config.workdir={workdir}",
      f"--config.warmstart.cache_dir={os.path.join(out, 'warm_start')}",
      "--config.train.progress_bar=false"]
  config = loader.load_config(CONFIG, tuning)
  if held_out:  # the loop evaluates the test split at its first and last evaluation
    config = loader.load_config(CONFIG, tuning + [heldout.through_loop(config, "test")])
  if os.path.exists(os.path.join(workdir, "checkpoints")):
    raise FileExistsError(f"{workdir} holds a previous run; remove it or pass another --out")
  load_before, wall, cpu = os.getloadavg()[0], time.time(), time.process_time()
  rows = grpo_loop.train(config)
  run = {"minutes": (time.time() - wall) / 60, "cpu_minutes": (time.process_time() - cpu) / 60,
         "load_before": load_before, "load_after": os.getloadavg()[0]}
  steps = runs.step_rows(rows)
  evals = runs.eval_rows(rows, "eval/reward_mean")
  tests = runs.eval_rows(rows, "test/reward_mean")
  grpo_seconds = runs.train_seconds(steps)
  curve = {"step": [r["step"] for r in evals], **{k: [r[f"eval/{k}"] for r in evals]
                                                 for k in KEYS}}
  result = {
      "seed": seed, **run, "grpo_seconds": grpo_seconds, "grpo_steps": len(steps),
      "warm_start": {"eval": _pick(evals[0], "eval"),
                     **({"test": _pick(tests[0], "test")} if tests else {})},
      "grpo": {"eval": _pick(evals[-1], "eval"),
               **({"test": _pick(tests[-1], "test")} if tests else {})},
      "curve": curve, "groups_with_signal": [r["groups_with_signal"] for r in steps],
      "sft": next(r for r in read_metrics(workdir) if "sft_loss_last" in r),
  }
  if control:
    ce_dir = os.path.join(out, f"seed{seed}_cross_entropy")
    graphdef, params, tokenizer, mesh, tasks = runs.warm_started(config, ce_dir)
    ce = runs.continue_cross_entropy(config, graphdef, params, tasks, tokenizer, mesh,
                                     seconds=grpo_seconds)
    result["cross_entropy"] = {**runs.eval_splits(config, graphdef, ce["params"], tokenizer,
                                                  mesh, KEYS),
                               "steps": ce["steps"], "seconds": ce["seconds"],
                               "loss_first": ce["loss_first"], "loss_last": ce["loss_last"]}
  return result


def table(runs_: list[dict], split: str) -> str:
  """The split's rows per seed and their mean ± SE over seeds."""
  header = ["seed", "warm start: format valid", "reward", "exact", "GRPO: format valid",
            "reward", "exact", "reward gain", "CE control: format valid", "reward", "exact"]
  nan = float("nan")

  def cells(r):
    w, g = r["warm_start"][split], r["grpo"][split]
    c = r["cross_entropy"][split] if "cross_entropy" in r else dict.fromkeys(KEYS, nan)
    return [w["diff/format_valid"], w["diff/reward_mean"], w["diff/exact"],
            g["diff/format_valid"], g["diff/reward_mean"], g["diff/exact"],
            g["diff/reward_mean"] - w["diff/reward_mean"],
            c["diff/format_valid"], c["diff/reward_mean"], c["diff/exact"]]

  show = lambda x: "-" if x != x else f"{x:.3f}"
  values = [cells(r) for r in runs_]
  lines = [[r["seed"], *(show(x) for x in v)] for r, v in zip(runs_, values)]
  means = [stats.mean_se(col) for col in zip(*values)]
  lines.append(["mean ± SE", *("-" if m != m else tables.pm(m, s) for m, s in means)])
  return tables.markdown(header, lines, "l" + "r" * 10)


def main():
  parser = runs.seed_parser(__doc__.splitlines()[0], "grpo_diffs_seeds", "diffs")
  parser.add_argument("--no-control", action="store_true",
                      help="skip the cross-entropy control")
  parser.add_argument("--no-held-out", action="store_true",
                      help="leave the test split alone (validation rows only)")
  args, overrides = runs.parse_overrides(parser)
  found = runs.over_seeds(
      args.seeds, lambda seed: run_seed(seed, args.out, overrides, control=not args.no_control,
                                        held_out=not args.no_held_out),
      args.out, "grpo_diffs_seeds.json", overrides)
  splits = [("eval", "validation")] + ([] if args.no_held_out else [("test", "test")])
  for split, name in splits:
    print(f"\n{name} split (eval.num_samples per task):")
    print(table(found, split))
  print("\n| seed | minutes | CPU minutes | load before / after | GRPO steps | GRPO seconds |")
  print("|---|---:|---:|---|---:|---:|")
  for r in found:
    print(f"| {r['seed']} | {r['minutes']:.1f} | {r['cpu_minutes']:.1f} | "
          f"{r['load_before']:.1f} / {r['load_after']:.1f} | {r['grpo_steps']} | "
          f"{r['grpo_seconds']:.0f} |")

  fig, axes = plots.pyplot().subplots(1, 2, figsize=(9, 3.6))
  for ax, key in zip(axes, ("diff/reward_mean", "diff/format_valid")):
    for r in found:
      ax.plot(r["curve"]["step"], r["curve"][key], marker="o", label=f"seed {r['seed']}")
    ax.set_xlabel("GRPO step")
    ax.set_title(f"validation {key}")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  png = plots.save(fig, results.folder("diffs", args.name), "grpo_diffs_seeds.png")
  runs.write_runs("diffs", args.name, found, overrides, files=[png],
                  config=loader.load_config(CONFIG, [*overrides, f"--config.seed={args.seeds[0]}"]))


if __name__ == "__main__":
  main()
