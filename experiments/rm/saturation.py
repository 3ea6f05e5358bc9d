"""Reward-model choice accuracy against training choices seen, with and without ground truth.

Claim: a reward model trained on real choices that also sees ground truth
(test results) saturates later than one that sees only the text.

For each seed and arm, one `rlcode train --config configs/rm_choices.py` run (a fresh process)
passes once over the training choices of --choices (each choice seen once, constant
learning rate after warm-up), evaluating choice accuracy on --split after 16, 32, 64, ...
choices. Arms: "text" (the candidate's text only) and "gt" (the text and the candidate's
test results, rm.features = tests_fraction, passed). References on the same split: the
users' own noise ceiling (the expected accuracy of always naming the highest-utility
candidate, sum over choices of max softmax(u / T)), and chance (mean 1/k).

    python -m experiments.rm.saturation [--seeds 0 1 2] [--split validation|held_out]
        [--choices experiments/out/choices/choices_warm.jsonl] [--init-from WORKDIR/warm_start]
        [--max-choices N] [--out experiments/out/rm_saturation] [--name rm_saturation]
        [--config.a.b=value ...]

--max-choices N trains on a fixed random N of the training choices (data.max_train_choices;
0: all of them), for a shorter curve on a loaded machine. Tune with --split validation;
report --split held_out once. Prints the table (mean ± standard error over seeds per
point), the point where each mean curve flattens (the fewest choices after which it
stays within 0.02 of its best), wall-clock and load. The runs and rm_saturation.json
stay under --out; the result, that JSON and rm_saturation.png, goes to results/rm/NAME.
"""

from __future__ import annotations

import argparse
import math
import os

from experiments.lib import ROOT, heldout, results, runs, stats
from rlcode.config import loader
from rlcode.data.choices import read_choices
from rlcode.rm.simulate import choice_probabilities

CONFIG = os.path.join(ROOT, "configs", "rm_choices.py")
ARMS = {"text": "()", "gt": "('tests_fraction','passed')"}
FLAT = 0.02


def mean_se(xs):
  """Mean and standard error over seeds (nan for one seed, as this table always printed)."""
  return stats.mean_se(xs, se_of_one=float("nan"))


def references(path, split):
  """(noise ceiling, chance) of the split's choices."""
  rows = read_choices(path)[split]
  ceiling = [max(choice_probabilities(c.extra["utility"], c.extra["temperature"]))
             for c in rows]
  return sum(ceiling) / len(rows), sum(1 / c.k for c in rows) / len(rows)


def flatten_point(ns, accs):
  """The fewest choices after which the curve stays within FLAT of its best."""
  best = max(accs)
  for i, n in enumerate(ns):
    if all(a >= best - FLAT for a in accs[i:]):
      return n
  return ns[-1]


def flags(seed, arm, args, overrides, batch, steps, eval_steps):
  """The overrides of one run of configs/rm_choices.py (--max-choices 0: every choice)."""
  workdir = os.path.join(args.out, f"{arm}_seed{seed}")
  return [f"--config.seed={seed}", f"--config.workdir={workdir}",
          f"--config.data.path={args.choices}", f"--config.data.eval_split={args.split}",
          f"--config.rm.features={ARMS[arm]}", f"--config.rm.init_from={args.init_from}",
          f"--config.rm.batch_choices={batch}", f"--config.train.steps={steps}",
          "--config.train.eval_every=0", f"--config.train.eval_steps={tuple(eval_steps)}",
          f"--config.train.checkpoint_every={steps}", "--config.train.progress_bar=false",
          f"--config.data.max_train_choices={args.max_choices or None}",
          "--config.optimizer.end_lr_fraction=1.0", *overrides]


def run(seed, arm, args, overrides, batch, steps, eval_steps):
  """One reward-model run in a fresh process: its accuracy curve."""
  workdir = os.path.join(args.out, f"{arm}_seed{seed}")
  run_flags = flags(seed, arm, args, overrides, batch, steps, eval_steps)
  if heldout.is_held_out(args.split):  # the loop's evaluation reads it: recorded
    heldout.record(loader.load_config(CONFIG, run_flags), args.split, None)
  done = runs.train_process(CONFIG, run_flags, workdir)
  evals = runs.eval_rows(done["rows"], "eval/accuracy")
  return {"seed": seed, "arm": arm, "minutes": done["minutes"],
          "choices_seen": [r["choices_seen"] for r in evals],
          "accuracy": [r["eval/accuracy"] for r in evals],
          "loss": [r["eval/loss"] for r in evals]}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
  parser.add_argument("--split", default="validation", choices=["validation", "held_out"])
  parser.add_argument("--choices", default="experiments/out/choices/choices_warm.jsonl")
  parser.add_argument("--init-from", default="experiments/out/grpo_rm/tests_seed0/warm_start")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--max-choices", type=int, default=0)
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments/out/rm_saturation"))
  parser.add_argument("--name", default="rm_saturation", help="the result's name under results/rm/")
  args, overrides = parser.parse_known_args()
  os.makedirs(args.out, exist_ok=True)
  n_train = len(read_choices(os.path.join(ROOT, args.choices))["train"])
  if args.max_choices:
    n_train = min(n_train, args.max_choices)
  steps = n_train // args.batch
  eval_steps = sorted({max(1, (16 << i) // args.batch) for i in range(20)
                       if (16 << i) <= steps * args.batch} | {steps})
  ceiling, chance = references(os.path.join(ROOT, args.choices), args.split)
  load_before = os.getloadavg()
  found = []
  for seed in args.seeds:
    for arm in args.arms:
      found.append(run(seed, arm, args, overrides, args.batch, steps, eval_steps))
      results.write_json({"runs": found}, os.path.join(args.out, "rm_saturation.json"))

  ns = found[0]["choices_seen"]
  summary = {}
  print(f"{args.split}: {n_train} training choices, batch {args.batch}; users' noise ceiling "
        f"{ceiling:.3f}, chance {chance:.3f}")
  print(f"{'choices':>8s} " + " ".join(f"{arm + ' acc':>16s}" for arm in args.arms))
  for arm in args.arms:
    per = [r for r in found if r["arm"] == arm]
    summary[arm] = {"mean_se": [mean_se([r["accuracy"][i] for r in per]) for i in range(len(ns))],
                    "minutes": [r["minutes"] for r in per]}
    summary[arm]["flattens_at"] = flatten_point(ns, [m for m, _ in summary[arm]["mean_se"]])
  for i, n in enumerate(ns):
    cells = [summary[a]["mean_se"][i] for a in args.arms]
    print(f"{n:8d} " + " ".join(f"{m:9.3f} ± {se:.3f}" for m, se in cells))
  for arm in args.arms:
    print(f"{arm}: flattens at {summary[arm]['flattens_at']} choices (first point within "
          f"{FLAT} of its best mean accuracy); minutes per run "
          f"{', '.join(f'{m:.1f}' for m in summary[arm]['minutes'])}")
  load_after = os.getloadavg()
  print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}")
  result = {"split": args.split, "choices": args.choices, "n_train": n_train,
            "batch": args.batch, "ceiling": ceiling, "chance": chance, "choices_seen": ns,
            "summary": summary, "runs": found, "overrides": overrides,
            "load_before": load_before, "load_after": load_after}
  results.write_json(result, os.path.join(args.out, "rm_saturation.json"))

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  shown = [i for i, n in enumerate(ns) if n > 0]  # the untrained point has no place on a log axis
  xs = [ns[i] for i in shown]
  for arm, label in (("text", "text only"), ("gt", "text + test results")):
    if arm not in summary:
      continue
    m = [summary[arm]["mean_se"][i][0] for i in shown]
    se = [0.0 if math.isnan(summary[arm]["mean_se"][i][1]) else summary[arm]["mean_se"][i][1]
          for i in shown]
    ax.plot(xs, m, marker="o", label=f"{label} (flat at {summary[arm]['flattens_at']})")
    ax.fill_between(xs, [a - s for a, s in zip(m, se)], [a + s for a, s in zip(m, se)],
                    alpha=0.2)
  ax.axhline(ceiling, color="k", ls="--", lw=1, label="users' noise ceiling")
  ax.axhline(chance, color="gray", ls=":", lw=1, label="chance")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("training choices seen")
  ax.set_ylabel(f"choice accuracy ({args.split})")
  ax.set_title(f"reward model saturation, {len(args.seeds)} seeds (mean ± s.e.)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  png = os.path.join(results.folder("rm", args.name), "rm_saturation.png")
  fig.savefig(png, dpi=110)
  config = loader.load_config(CONFIG, flags(args.seeds[0], args.arms[0], args, overrides,
                                            args.batch, steps, eval_steps))
  print("wrote", results.write("rm", args.name, result, config=config, files=[png]))


if __name__ == "__main__":
  main()
