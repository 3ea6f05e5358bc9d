"""How much of the pass@k - pass@1 gap majority voting and a reward model close.

Claim: pass@k is far above pass@1; majority voting or a reward model picking
one of k samples closes part of that gap.

For each task set (the tiny held-out problems; HumanEval, the problems whose prompt and
max_new_tokens fit the policy's context), --n samples per task from a trained policy at
the eval temperature, each run against its tests; then, for k = 1, 2, 4, ..., n: pass@1 (first@k),
pass@k (oracle@k), majority@k (votes by behaviour on the tests' inputs, rlcode.behaviour)
and rm@k (the highest score of a reward model trained on choices, `rlcode train --config
configs/rm_choices.py`), each
the expectation over draws of k of the n samples (rlcode.selection), and the fraction of
the gap each selector closes, (sel@k - pass@1) / (pass@k - pass@1).

    python -m experiments.rm.selection --policy WORKDIR --rm RM_WORKDIR [--n 64]
        [--sets tiny humaneval] [--out experiments/out/selection] [--name selection]

Prints the tables, wall-clock and load. The samples and selection.json (rewritten as
sets finish) stay under --out; the result, that JSON and selection.png, goes to
results/rm/NAME.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from experiments.lib import ROOT, heldout, results, runs
from rlcode.config.record import recorded_config
from rlcode.data.humaneval import humaneval_tasks
from rlcode.policy import policy_eval
from rlcode.evaluation import selection, selection_eval
from rlcode.parallel import sharding
from rlcode.rm import scorer

SELECTORS = ["majority", "rm"]


def task_set(name, config):
  """The tasks of a set: "tiny" (the config's held-out split) or "humaneval"."""
  if name == "tiny":
    return heldout.read(config, "held_out")
  return humaneval_tasks()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--policy", default="experiments/out/grpo_rm/tests_seed0")
  parser.add_argument("--rm", default="experiments/out/rm_choices")
  parser.add_argument("--n", type=int, default=64)
  parser.add_argument("--sets", nargs="+", default=["tiny", "humaneval"],
                      choices=["tiny", "humaneval"])
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments/out/selection"))
  parser.add_argument("--name", default="selection", help="the result's name under results/rm/")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  config = recorded_config(args.policy, "--policy")
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer, step, _ = runs.restore_policy(config, args.policy, mesh)
  ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= args.n]
  ev = config.eval
  found = {"policy": args.policy, "policy_step": step, "rm": args.rm, "n": args.n,
             "temperature": ev.temperature, "max_new_tokens": ev.max_new_tokens, "sets": {}}
  for name in args.sets:
    start, load_before = time.time(), os.getloadavg()
    every = task_set(name, config)
    # Sampling needs the prompt and the new tokens to fit the context (references do not).
    tasks = [t for t in every
             if len(tokenizer.encode(t.prompt)) + ev.max_new_tokens <= model.cfg.max_seq_len]
    fit = {"tasks": len(every), "kept": len(tasks)}
    row_tasks, texts = policy_eval.sample_completions(
        model, tokenizer, tasks, num_samples=args.n, temperature=ev.temperature,
        max_new_tokens=ev.max_new_tokens, seed=config.seed + 7919,
        batch_prompts=max(1, 2048 // args.n), mesh=mesh, progress=True)
    pairs = [(t.id, c) for t, c in zip(row_tasks, texts)]
    with open(os.path.join(args.out, f"{name}_samples.jsonl"), "w") as f:
      for tid, c in pairs:
        f.write(json.dumps({"task_id": tid, "completion": c}) + "\n")
    table = selection_eval.evaluate_selection(tasks, pairs, selectors=SELECTORS, ks=ks,
                                              rm_scores=scorer.selection_scorer(args.rm),
                                              workers=args.workers)
    table.update(fit=fit, minutes=(time.time() - start) / 60, load_before=load_before,
                 load_after=os.getloadavg())
    found["sets"][name] = table
    print(f"== {name}: {fit} ({table['minutes']:.1f} min, load {load_before} -> "
          f"{table['load_after']})")
    print(selection.format_table(table, SELECTORS))
    results.write_json(found, os.path.join(args.out, "selection.json"))

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(found["sets"]), figsize=(5.5 * len(found["sets"]), 4),
                           squeeze=False)
  labels = {"oracle": "pass@k (oracle)", "majority": "majority@k", "rm": "rm@k",
            "first": "pass@1 (first)"}
  for ax, (name, table) in zip(axes[0], found["sets"].items()):
    for sel in ("oracle", "majority", "rm", "first"):
      ax.plot(ks, [table[sel][k] for k in ks], marker="o", label=labels[sel])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k samples")
    ax.set_ylabel("share of tasks solved by the selected sample")
    ax.set_title(f"{name}: {table['n_tasks']} tasks, n = {args.n}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  png = os.path.join(results.folder("rm", args.name), "selection.png")
  fig.savefig(png, dpi=110)
  print("wrote", results.write("rm", args.name, found, config=config, files=[png]))


if __name__ == "__main__":
  main()
