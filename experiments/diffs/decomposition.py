"""Does cutting PRs into commits, files and hunks give GRPO a usable signal?

Claim: a whole PR is solved about one time in a thousand, too
rarely for group-relative advantages to see it, and smaller units (commits,
files, hunks) reach the usable one-in-a-hundred range. This measures, for one
policy, on the held-out (test-split) PRs of each repository, at each
granularity (pr, commit, file, hunk):

- exact: the fraction of samples whose patch equals the real one after
  normalisation (rlcode.rewards.diffs.compare), and success: the fraction with
  SWE-RL similarity >= 0.9 (the diff reward's success);
- tasks with a success among G samples, and the fraction of GRPO groups (G
  samples of one task) whose rewards are not all equal: the groups that give an
  update any signal;
- units solved among all held-out units: a unit whose prompt or reference does
  not fit the policy's context counts as unsolved (the policy cannot try it).

95% intervals are Wilson score intervals. Per-sample rates use the samples as
the count, which understates the width when one task's samples succeed together
(they are not independent); per-task rates (tasks with a success, groups with
signal, units solved) count tasks, which are.

Command (from the repository root):

  python -m experiments.diffs.decomposition
  python -m experiments.diffs.decomposition --workdir workdirs/other --max-tasks 0

The policy is the one configs/grpo_pr_diffs.py trains (attrs and
more-itertools hunks, warm start then GRPO), read from --workdir (default
workdirs/grpo_pr_diffs). When that workdir holds no checkpoint, the script first
runs that job there, exactly `rlcode train --config configs/grpo_pr_diffs.py
--config.workdir=WORKDIR`. Extra `--config.KEY=VALUE` arguments override the
config for both (give the same ones to reuse a workdir). Each repository of the
config's `data.repo` is measured on its own, mined at each granularity with the
config's filters and excerpts. At most --max-tasks fitting tasks per
(repository, granularity) are sampled (the first by id: task ids are commit
hashes, so a pseudo-random subset of PRs), G = --samples (default: the config's
rl.group_size) completions each at the config's eval temperature and budget.

Prints a table; writes --out (default experiments/out/decomposition.json) and the
result, that JSON and decomposition.png, to results/diffs/NAME (default decomposition).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from experiments.lib import ROOT, heldout, results, runs, tables
from experiments.lib.stats import group_stats, rate
from rlcode.config import loader
from rlcode.data import sources
from rlcode.data.git import GRANULARITIES
from rlcode.parallel import sharding
from rlcode.rl import rollout
from rlcode.train import grpo_loop

CONFIG = os.path.join(ROOT, "configs", "grpo_pr_diffs.py")


def measure(config, model, tokenizer, mesh, repo: str, granularity: str, split: str,
            samples: int, max_tasks: int, seed: int) -> dict:
  """One row: the repository's `split` mined at `granularity`, G = `samples` answers to
  each of at most `max_tasks` fitting tasks, scored by the diff reward."""
  data = config.data.copy_and_resolve_references()
  with data.unlocked():
    del data["repo"]
    data.repo = repo
    data.mining.granularity = granularity
  tasks = heldout.tasks(config, split, data)
  ev = config.eval
  kept, counts = rollout.fit_context(tasks, tokenizer, max_seq_len=model.cfg.max_seq_len,
                                     max_new_tokens=ev.max_new_tokens)
  chosen = kept[:max_tasks] if max_tasks else kept
  row = {"repo": os.path.basename(repo), "granularity": granularity, "units": len(tasks),
         **counts, "prs": len({t.extra.pr for t in tasks}), "sampled": len(chosen),
         # Fitting tasks whose reference answer is longer than the sampling budget.
         "oracle_over_budget": sum(
             len(tokenizer.encode(t.reference)) >= ev.max_new_tokens for t in chosen)}
  if not chosen:
    return row
  scores, exact = [], []
  for start in range(0, len(chosen), ev.batch_prompts):
    chunk = chosen[start:start + ev.batch_prompts]
    ro = rollout.sample(model, tokenizer, chunk, group_size=samples,
                        max_new_tokens=ev.max_new_tokens, temperature=ev.temperature,
                        seed=seed + start, mesh=mesh)
    out = rollout.score(ro, {"diff": 1.0})
    scores.append(np.asarray(out.scores).reshape(len(chunk), samples))
    exact.append(np.array([bool(d["diff"].get("exact")) for d in out.details]
                          ).reshape(len(chunk), samples))
  stats = group_stats(np.concatenate(scores), np.concatenate(exact))
  # Every held-out unit: one not sampled (too long for the context, or beyond
  # --max-tasks) counts as unsolved only when it did not fit.
  solved = stats["tasks_with_a_success"]["k"]
  row["units_solved"] = rate(solved, len(chosen) + len(tasks) - len(kept))
  return {**row, **stats}


def _interval(r: dict | None, digits: int = 4) -> str:
  if r is None:
    return "-"
  return f"{r['k']}/{r['n']} = {r['rate']:.{digits}f} [{r['lo']:.{digits}f}, {r['hi']:.{digits}f}]"


def table(rows: list[dict]) -> str:
  """The rows with their counts and 95% Wilson intervals."""
  cols = ["repo", "granularity", "held-out PRs", "units", "fit", "sampled", "format valid",
          "exact (per sample)", "similarity >= 0.9 (per sample)", "tasks with a success",
          "groups with signal", "units solved (all units)"]
  lines = []
  for r in rows:
    fv = r.get("format_valid")
    lines.append([
        r["repo"], r["granularity"], str(r["prs"]), str(r["units"]), str(r["kept"]),
        str(r["sampled"]), "-" if fv is None else f"{fv:.3f}", _interval(r.get("exact")),
        _interval(r.get("success")), _interval(r.get("tasks_with_a_success"), 3),
        _interval(r.get("groups_with_signal"), 3), _interval(r.get("units_solved"), 3)])
  return tables.markdown(cols, lines, "ll" + "r" * (len(cols) - 2))


def plot(rows: list[dict], path: str, title: str) -> None:
  """Success and groups with signal by granularity, a bar a repository (log scale)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  repos = list(dict.fromkeys(r["repo"] for r in rows))
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
  for ax, key, label in ((axes[0], "success", "similarity >= 0.9, per sample"),
                         (axes[1], "groups_with_signal", "groups with signal")):
    for k, repo in enumerate(repos):
      mine = [r for r in rows if r["repo"] == repo]
      x = np.arange(len(mine)) + 0.35 * (k - (len(repos) - 1) / 2)
      got = [r.get(key) or {"rate": 0.0, "lo": 0.0, "hi": 0.0} for r in mine]
      values = np.array([g["rate"] for g in got])
      err = np.array([[v - g["lo"] for v, g in zip(values, got)],
                      [g["hi"] - v for v, g in zip(values, got)]])
      ax.bar(x, values, width=0.35, label=repo, yerr=err, capsize=3)
    ax.set_xticks(np.arange(len(GRANULARITIES)), GRANULARITIES)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.axhline(0.01, color="gray", lw=0.8, ls="--")
    ax.axhline(0.001, color="gray", lw=0.8, ls=":")
    ax.set_title(label + " (95% Wilson)", fontsize=9)
    ax.legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default=CONFIG)
  parser.add_argument("--workdir", default="workdirs/grpo_pr_diffs")
  parser.add_argument("--split", default="test", help="the held-out split (default test)")
  parser.add_argument("--samples", type=int, default=0,
                      help="G, completions per task (default: the config's rl.group_size)")
  parser.add_argument("--max-tasks", type=int, default=100,
                      help="fitting tasks sampled per repository and granularity (0: all)")
  parser.add_argument("--out", default="experiments/out/decomposition.json")
  parser.add_argument("--name", default="decomposition",
                      help="the result's name under results/diffs/")
  args, overrides = parser.parse_known_args(argv)
  for item in overrides:
    if not item.startswith(loader.PREFIX):
      parser.error(f"unknown argument {item!r}")
  overrides = [f"--config.workdir={args.workdir}", *overrides]
  config = loader.load_config(args.config, overrides)
  config.train.progress_bar = False
  samples = args.samples or config.rl.group_size

  mesh = sharding.mesh_from_config(config.mesh)
  start = time.perf_counter()
  trained_here = not os.path.isdir(os.path.join(args.workdir, "checkpoints"))
  if trained_here:
    print(f"no checkpoint in {args.workdir}: training the policy there", file=sys.stderr)
    grpo_loop.train(config)
  model, tokenizer, step, _ = runs.restore_policy(config, args.workdir, mesh)
  repos = config.data.repo if isinstance(config.data.repo, tuple) else (config.data.repo,)
  rows = [measure(config, model, tokenizer, mesh, repo, g, args.split, samples,
                  args.max_tasks, config.seed + 7919)
          for repo in repos for g in GRANULARITIES]
  seconds = time.perf_counter() - start

  print(table(rows))
  heads = {os.path.basename(b.builder_config.mining.source): b.builder_config.head
           for b in sources.builders(config.data)}
  result = {"heads": heads, "split": args.split,
            "policy": {"workdir": args.workdir, "step": step, "trained_here": trained_here,
                       "overrides": overrides},
            "samples_per_task": samples, "max_tasks": args.max_tasks,
            "max_new_tokens": config.eval.max_new_tokens,
            "temperature": config.eval.temperature, "seconds": seconds, "rows": rows}
  results.write_json(result, args.out)
  png = os.path.join(results.folder("diffs", args.name), "decomposition.png")
  plot(rows, png, f"{args.split} split, G={samples}, policy step {step}")
  where = results.write("diffs", args.name, result, config=config, files=[png])
  print(f"wrote {args.out} and {where} ({seconds:.0f} s)")


if __name__ == "__main__":
  main()
