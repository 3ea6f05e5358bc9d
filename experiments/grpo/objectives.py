"""The default job's objectives side by side: GRPO's PPO surrogate against GSPO, CISPO, the
rollout correction and on-policy distillation, on the same seeds, held out read once.

Each arm is `python -m experiments.grpo.tiny_seeds --seeds S --arms grpo --out RUNS/ARM_sS
--config.rl...` (one process per seed and arm: its GRPO run, then pass@1 of the warm start
and of the GRPO policy on the held-out split). This script reads those runs, nothing is
run again:

    python -m experiments.grpo.objectives --runs RUNS [--baseline results/grpo/grpo_tiny_10seeds]
        [--name objectives]

An arm is the name before `_s<seed>`; the baseline (PPO, no correction) is the default job's
10-seed result, its rows of the seeds the arms ran. For every arm: held-out and validation
gains over the warm start (mean ± SE over seeds), the per-seed differences against PPO on
the same seeds and warm start (held out and validation), the training reward's rise, and
the sampler/trainer mismatch its run logged (the rollout correction's mismatch_kl,
mismatch_ratio_max, mismatch_masked_frac, averaged over steps; recorded only where an arm
recomputes every row) and distillation's reverse KL. Writes results/grpo/NAME.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re

from experiments.lib import ROOT, results, stats

MISMATCH = ("mismatch_kl", "mismatch_ratio_max", "mismatch_masked_frac", "distill_reverse_kl")


def logged(workdir: str) -> dict:
  """The mean over steps of each MISMATCH key the run's metrics.jsonl holds."""
  sums, counts = collections.Counter(), collections.Counter()
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      for key in MISMATCH:
        if key in row:
          sums[key] += row[key]
          counts[key] += 1
  return {key: sums[key] / counts[key] for key in counts}


def arms(runs_dir: str) -> dict[str, list[dict]]:
  """{arm: its seeds' runs, by seed}, each run with `logged` of its workdir."""
  found = collections.defaultdict(list)
  for path in sorted(glob.glob(os.path.join(runs_dir, "*", "grpo_tiny_seeds.json"))):
    name = os.path.basename(os.path.dirname(path))
    match = re.fullmatch(r"(.+)_s(\d+)", name)
    with open(path) as f:
      payload = json.load(f)
    for run in payload["runs"]:
      if not match or "held_out" not in run:
        continue
      run = {**run, "overrides": payload["overrides"],
             "logged": logged(os.path.join(os.path.dirname(path), f"seed{run['seed']}"))}
      found[match.group(1)].append(run)
  return {arm: sorted(rs, key=lambda r: r["seed"]) for arm, rs in found.items()}


def summary(runs: list[dict], base: dict[int, dict]) -> dict:
  held = [r["held_out"]["grpo"] - r["held_out"]["warm_start"] for r in runs]
  val = [r["val_pass@1"][-1] - r["val_pass@1"][0] for r in runs]
  against = [r["held_out"]["grpo"] - base[r["seed"]]["held_out"]["grpo"] for r in runs]
  val_against = [r["val_pass@1"][-1] - base[r["seed"]]["val_pass@1"][-1] for r in runs]
  rise = [r["reward_last10"] - r["reward_first10"] for r in runs]
  out = {"seeds": [r["seed"] for r in runs], "held_out_gain": stats.mean_se(held),
         "val_gain": stats.mean_se(val), "held_out_minus_ppo": stats.mean_se(against),
         "val_minus_ppo": stats.mean_se(val_against),
         "reward_rise": stats.mean_se(rise),
         "per_seed": {r["seed"]: {"held_out": r["held_out"], "val_first": r["val_pass@1"][0],
                                  "val_last": r["val_pass@1"][-1], "logged": r.get("logged", {})}
                      for r in runs}}
  for key in MISMATCH:
    values = [r["logged"][key] for r in runs if key in r.get("logged", {})]
    if values:
      out[key] = stats.mean_se(values)
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", required=True)
  parser.add_argument("--baseline", default=os.path.join(ROOT, "results", "grpo",
                                                         "grpo_tiny_10seeds"))
  parser.add_argument("--name", default="objectives")
  args = parser.parse_args()
  with open(os.path.join(args.baseline, "result.json")) as f:
    base = {r["seed"]: r for r in json.load(f)["runs"]}
  found = arms(args.runs)
  seeds = sorted({r["seed"] for rs in found.values() for r in rs})
  table = {"ppo": summary([base[s] for s in seeds], base)}
  table.update({arm: summary(rs, base) for arm, rs in sorted(found.items())})
  fmt = lambda ms: f"{ms[0]:+.3f} ± {ms[1]:.3f}"
  print("| arm | seeds | held out: gain over the warm start | held out: arm − PPO | "
        "validation gain | validation: arm − PPO | training reward rise | mismatch k3 KL | "
        "largest ratio | reverse KL to the teacher |")
  print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
  for arm, s in table.items():
    kl = f"{s['mismatch_kl'][0]:.1e}" if "mismatch_kl" in s else "-"
    ratio = f"{s['mismatch_ratio_max'][0]:.5f}" if "mismatch_ratio_max" in s else "-"
    rkl = f"{s['distill_reverse_kl'][0]:.3f}" if "distill_reverse_kl" in s else "-"
    print(f"| {arm} | {','.join(map(str, s['seeds']))} | {fmt(s['held_out_gain'])} | "
          f"{fmt(s['held_out_minus_ppo'])} | {fmt(s['val_gain'])} | {fmt(s['val_minus_ppo'])} | "
          f"{fmt(s['reward_rise'])} | "
          f"{kl} | {ratio} | {rkl} |")
  print("wrote", results.write("grpo", args.name, {
      "baseline": os.path.relpath(args.baseline, ROOT), "arms": table,
      "overrides": {arm: rs[0]["overrides"] for arm, rs in found.items()}}))


if __name__ == "__main__":
  main()
