"""Asynchronous rollouts on the default job: wall-clock per step and held-out pass@1 for
rl.max_staleness (eta) = 0, 1, 2, 4 over seeds, side by side.

    python -m experiments.grpo.async_rl [--etas 0 1 2 4] [--seeds 0 1 2] [--steps 30]
        [--out experiments/out/async_rl] [--name async_rl] [--config.a.b=value ...]

Arms already recorded in --out (same --steps and overrides) are not rerun, so the grid
can be run a few seeds at a time; the table covers every recorded arm.

Each arm is `rlcode train --config configs/grpo_tiny.py --config.seed=S
--config.rl.max_staleness=ETA` in its own workdir (a fresh process; the warm start is the
config's), cut to --steps GRPO steps with no periodic evaluation; then the final policy's
pass@1 on the held-out split (config.eval: 8 samples per problem at the rollout
temperature). Arms run seed by seed, eta inside, so a change in the machine's load
touches every eta alike. The processes share a persistent compilation cache under
--out: compilation is not what is compared, and the first two steps of every arm (which
compile) are left out of the per-step figures.

Per arm: median seconds per step (the trainer's wall-clock from taking a batch to the
next), and the mean seconds per step spent in each part: sampling (generate), reward
(the sandbox), update, the proximal forward for stale rows, the weight copy, and the
time the trainer and the sampler each waited for the other. Prints the table, with mean
and standard error over seeds; async_rl.json (every recorded arm) stays under --out and
goes to results/grpo/NAME/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics

from experiments.lib import ROOT, heldout, results, runs, stats
from rlcode.config import loader
from rlcode.parallel import sharding

CONFIG = os.path.join(ROOT, "configs", "grpo_tiny.py:references")
PARTS = ("rollout_seconds", "reward_seconds", "update_seconds", "proximal_seconds",
         "sync_seconds", "trainer_idle_seconds", "sampler_idle_seconds")
SKIP = 2  # steps that compile


def mean_se(xs):
  """Mean and standard error over seeds (nan for one seed, as this table always printed)."""
  return stats.mean_se(xs, se_of_one=float("nan"))


def arm(seed, eta, steps, workdir, overrides, cache):
  """One arm in a fresh process (its own workdir, the shared compilation cache): its
  per-step figures."""
  flags = [f"--config.seed={seed}", f"--config.rl.max_staleness={eta}",
           f"--config.train.steps={steps}", "--config.train.eval_every=0",
           f"--config.train.checkpoint_every={steps}", "--config.train.progress_bar=false",
           f"--config.workdir={workdir}", *overrides]
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_COMPILATION_CACHE_DIR=cache,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  run = runs.train_process(CONFIG, flags, workdir, env=env)
  rows = runs.step_rows(run["rows"])
  timed = rows[SKIP:]
  return {"seed": seed, "eta": eta, "minutes": run["minutes"],
          "grpo_seconds": sum(r["step_seconds"] for r in rows),
          "step_seconds": statistics.median(r["step_seconds"] for r in timed),
          **{p: statistics.mean(r[p] for r in timed) for p in PARTS},
          "staleness": {k.split("/")[1]: sum(r[k] for r in rows)
                        for k in rows[0] if k.startswith("staleness/")},
          "iw_clip_frac": statistics.mean(r["iw_clip_frac"] for r in rows),
          "reward_mean_last5": statistics.mean(r["reward_mean"] for r in rows[-5:])}


def held_out(seed, workdir, overrides):
  """The final policy's pass@1 on the held-out split."""
  config = loader.load_config(CONFIG, [f"--config.seed={seed}", *overrides])
  mesh = sharding.mesh_from_config(config.mesh)
  tasks = heldout.read(config, "held_out")[:config.data.max_eval_tasks]
  return runs.restored_pass_at_1(config, workdir, tasks, mesh)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--etas", type=int, nargs="+", default=[0, 1, 2, 4])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments/out/async_rl"))
  parser.add_argument("--name", default="async_rl", help="the result's name under results/grpo/")
  args, overrides = parser.parse_known_args()
  os.makedirs(args.out, exist_ok=True)
  cache = os.path.join(args.out, "jax_cache")
  # Arms already in async_rl.json (same steps and overrides) are kept, not rerun: the grid
  # can be run in pieces (a few seeds at a time) and the table covers all of them.
  saved = os.path.join(args.out, "async_rl.json")
  found = []
  if os.path.exists(saved):
    with open(saved) as f:
      old = json.load(f)
    if old["steps"] == args.steps and old["overrides"] == overrides:
      found = old["runs"]
  done = {(r["seed"], r["eta"]) for r in found}
  for seed in args.seeds:
    for eta in args.etas:
      if (seed, eta) in done:
        continue
      workdir = os.path.join(args.out, f"seed{seed}_eta{eta}")
      shutil.rmtree(workdir, ignore_errors=True)  # an arm cut short would resume, not restart
      run = arm(seed, eta, args.steps, workdir, overrides, cache)
      run["held_out_pass@1"] = held_out(seed, workdir, overrides)
      found.append(run)
      print(json.dumps(run), flush=True)
      results.write_json({"steps": args.steps, "overrides": overrides, "runs": found}, saved)

  short = {"rollout_seconds": "sample", "reward_seconds": "reward", "update_seconds": "update",
           "proximal_seconds": "prox", "sync_seconds": "sync",
           "trainer_idle_seconds": "trn idle", "sampler_idle_seconds": "smp idle"}
  print(f"\n{'eta':>3s} {'s/step':>13s} {'speedup':>7s} {'held-out pass@1':>17s} "
        + " ".join(f"{short[p]:>8s}" for p in PARTS))
  base = {r["seed"]: r["step_seconds"] for r in found if r["eta"] == args.etas[0]}
  for eta in args.etas:
    mine = [r for r in found if r["eta"] == eta and r["seed"] in base]
    step, step_se = mean_se([r["step_seconds"] for r in mine])
    speed = statistics.mean(base[r["seed"]] / r["step_seconds"] for r in mine)
    p1, p1_se = mean_se([r["held_out_pass@1"] for r in mine])
    parts = " ".join(f"{statistics.mean(r[p] for r in mine):8.2f}" for p in PARTS)
    print(f"{eta:3d} {step:6.2f} ± {step_se:4.2f} {speed:7.2f} {p1:8.3f} ± {p1_se:5.3f} {parts}")
  print(f"\n{'eta':>3s} {'seeds':>5s} {'rows by lag 0, 1, ... (share)':<32s} {'iw clip':>7s} "
        f"{'reward, last 5 steps':>20s}")
  for eta in args.etas:
    mine = [r for r in found if r["eta"] == eta and r["seed"] in base]
    lags = {}
    for r in mine:
      for lag, n in r["staleness"].items():
        lags[int(lag)] = lags.get(int(lag), 0) + n
    total = sum(lags.values())
    shares = ", ".join(f"{lags[k] / total:.2f}" for k in sorted(lags))
    reward, reward_se = mean_se([r["reward_mean_last5"] for r in mine])
    clip = statistics.mean(r["iw_clip_frac"] for r in mine)
    print(f"{eta:3d} {len(mine):5d} {shares:<32s} {clip:7.4f} {reward:12.3f} ± {reward_se:5.3f}")
  config = loader.load_config(CONFIG, [f"--config.seed={args.seeds[0]}", *overrides])
  print("wrote", results.write("grpo", args.name,
                               {"steps": args.steps, "overrides": overrides, "runs": found},
                               config=config))  # the first seed's, at the config's eta


if __name__ == "__main__":
  main()
