"""Does splitting commits into files and hunks give GRPO a usable signal?

The seed's claim: a whole commit is solved about one time in a thousand, too
rarely for group-relative advantages to see it, and decomposing it into file
and hunk tasks turns that into a usable signal. This measures, for one policy
and one repository, at each granularity (commit, file, hunk) on the held-out
split: the success rate (SWE-RL similarity >= 0.9, the diff reward's
success), the fraction of tasks with at least one success among G samples,
and the fraction of GRPO groups whose G rewards are not all equal (a group
with any non-zero advantage).

Command (from the repository root):

  python experiments/decomposition.py
  python experiments/decomposition.py --repo /path/to/repo --workdir workdirs/other

The policy is the one configs/grpo_diffs.py trains: the ~1M-parameter byte-level
decoder after its supervised warm start on the training split's hunk tasks
and its GRPO steps, read from --workdir (default workdirs/grpo_diffs). When that
workdir holds no checkpoint, the script first runs that job there, exactly
`rlcode train --config configs/grpo_diffs.py --config.data.repo=REPO
--config.workdir=WORKDIR`. Extra `--config.KEY=VALUE` arguments override the
config for both (give the same ones to reuse a workdir).

Tasks: the config's held-out split (the latest quarter of the kept commits;
the "held-out commits" column shows it is the same commits at every
granularity, which holds unless a commit's units at one granularity are all
inexpressible), mined at each granularity with the config's filters and excerpts. Only tasks
that fit the policy's context with eval.max_new_tokens are sampled
(rlcode.rollout.fit_context); the table counts the rest. Each task gets
--samples completions at the config's eval temperature.

Prints a table; writes experiments/out/decomposition.json and
experiments/out/decomposition.png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from rlcode import config_lib, evaluate, rollout, sharding, train
from rlcode.data import sources
from rlcode.data.git import GRANULARITIES
from rlcode.rewards.diffs import FORMAT_ERROR_SCORE, SUCCESS_THRESHOLD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "grpo_diffs.py")


def group_stats(scores_pg: np.ndarray) -> dict:
  """Success and signal statistics of rewards [P tasks, G samples]."""
  success = scores_pg >= SUCCESS_THRESHOLD
  valid = scores_pg != FORMAT_ERROR_SCORE
  n = scores_pg.size
  return {
      "samples": int(n),
      "success_rate": float(success.mean()),
      # No success in n samples: the one-sided 95% upper bound (1 - 0.05**(1/n)).
      "success_rate_upper95": float(1 - 0.05 ** (1 / n)) if not success.any() else None,
      "tasks_with_a_success": float(success.any(1).mean()),
      "groups_with_signal": float((scores_pg.max(1) > scores_pg.min(1)).mean()),
      "format_error_rate": float(1 - valid.mean()),
      "similarity_of_valid": float(scores_pg[valid].mean()) if valid.any() else None,
      "reward_mean": float(scores_pg.mean()),
  }


def measure(config, model, tokenizer, mesh, granularity: str, split: str, samples: int,
            seed: int) -> dict:
  config.data.mining.granularity = granularity
  tasks = sources.load(config.data, split)
  ev = config.eval
  kept, counts = rollout.fit_context(tasks, tokenizer, max_seq_len=model.cfg.max_seq_len,
                                     max_new_tokens=ev.max_new_tokens)
  row = {"granularity": granularity, "tasks": len(tasks), **counts,
         "commits": len({t.extra["commit"] for t in tasks}),
         # Kept tasks whose oracle answer is longer than the sampling budget.
         "oracle_over_budget": sum(
             len(tokenizer.encode(t.reference)) >= ev.max_new_tokens for t in kept)}
  if not kept:
    return row
  groups = []
  for start in range(0, len(kept), ev.batch_prompts):
    chunk = kept[start:start + ev.batch_prompts]
    ro = rollout.sample(model, tokenizer, chunk, group_size=samples,
                        max_new_tokens=ev.max_new_tokens, temperature=ev.temperature,
                        seed=seed + start, mesh=mesh)
    out = rollout.score(ro, dict(config.rewards),
                        {k: dict(v) for k, v in config.reward_options.items()})
    groups.append(np.asarray(out.scores).reshape(len(chunk), samples))
  return {**row, **group_stats(np.concatenate(groups))}


def _fmt(value, digits=3) -> str:
  if value is None:
    return "-"
  return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(rows: list[dict]) -> str:
  cols = [("granularity", "granularity"), ("commits", "held-out commits"),
          ("tasks", "tasks"), ("kept", "fit the context"),
          ("prompt_too_long", "prompt too long"), ("reference_too_long", "answer too long"),
          ("oracle_over_budget", "oracle > budget"), ("samples", "samples"),
          ("success_rate", "success rate"), ("success_rate_upper95", "95% upper bound"),
          ("tasks_with_a_success", "tasks with a success"),
          ("groups_with_signal", "groups with signal"),
          ("format_error_rate", "format errors"), ("similarity_of_valid", "similarity (valid)")]
  lines = ["| " + " | ".join(c[1] for c in cols) + " |",
           "|---|" + "---:|" * (len(cols) - 1)]
  for r in rows:
    lines.append("| " + " | ".join(_fmt(r.get(k)) for k, _ in cols) + " |")
  return "\n".join(lines)


def plot(rows: list[dict], path: str, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = [r["granularity"] for r in rows]
  x = np.arange(len(rows))
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  for ax, key, label in ((axes[0], "success_rate", "success rate (similarity >= 0.9)"),
                         (axes[1], "groups_with_signal", "groups with signal")):
    values = [r.get(key, 0.0) for r in rows]
    ax.bar(x, values, color="tab:blue")
    if key == "success_rate":
      upper = [r.get("success_rate_upper95") or 0.0 for r in rows]
      ax.errorbar(x, values, yerr=[np.zeros(len(rows)), upper], fmt="none", ecolor="k",
                  capsize=4, label="95% upper bound when none")
      ax.legend(fontsize=7)
    for i, r in enumerate(rows):
      ax.annotate(f"{r['kept']}/{r['tasks']} tasks fit", (i, 0), textcoords="offset points",
                  xytext=(0, 3), ha="center", fontsize=7)
    ax.set_xticks(x, names)
    ax.set_ylim(0, 1)
    ax.set_title(label, fontsize=9)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default=CONFIG)
  parser.add_argument("--repo", default="", help="default: the config's data.repo")
  parser.add_argument("--workdir", default="workdirs/grpo_diffs")
  parser.add_argument("--split", default="", help="default: the config's eval split")
  parser.add_argument("--samples", type=int, default=8, help="G, completions per task")
  parser.add_argument("--out", default="experiments/out/decomposition.json")
  args, overrides = parser.parse_known_args(argv)
  for item in overrides:
    if not item.startswith(config_lib.PREFIX):
      parser.error(f"unknown argument {item!r}")
  overrides = [f"--config.workdir={args.workdir}", *overrides]
  if args.repo:
    overrides.append(f"--config.data.repo={args.repo}")
  config = config_lib.load_config(args.config, overrides)
  config.train.progress_bar = False

  mesh = sharding.mesh_from_config(config.mesh)
  start = time.perf_counter()
  trained_here = not os.path.isdir(os.path.join(args.workdir, "checkpoints"))
  if trained_here:
    print(f"no checkpoint in {args.workdir}: training the policy there", file=sys.stderr)
    train.train(config)
  model, tokenizer, step, _ = evaluate.restore_policy(config, args.workdir, mesh)
  split = args.split or config.data.eval_split
  rows = [measure(config, model, tokenizer, mesh, g, split, args.samples, config.seed + 7919)
          for g in GRANULARITIES]
  seconds = time.perf_counter() - start

  print(table(rows))
  mined = sources.builder(config.data).builder_config
  result = {"repo": mined.mining.source, "head": mined.head,
            "split": split, "policy": {"workdir": args.workdir, "step": step,
                                       "trained_here": trained_here, "overrides": overrides},
            "samples_per_task": args.samples, "max_new_tokens": config.eval.max_new_tokens,
            "temperature": config.eval.temperature, "seconds": seconds, "rows": rows}
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  png = os.path.splitext(args.out)[0] + ".png"
  plot(rows, png, f"{os.path.basename(result['repo'])} @ {result['head'][:8]}, "
       f"{split} split, G={args.samples}, policy step {step}")
  print(f"wrote {args.out} and {png} ({seconds:.0f} s)")


if __name__ == "__main__":
  main()
