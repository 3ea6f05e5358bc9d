"""Online learning from simulated users: acceptance with `learn-online` running vs a frozen
server, over the same wall-clock, with 1 and with 3 candidates per prompt (3 seeds).

    python -m experiments.online.users_learn [--seeds 0,1,2] [--seconds 90] [--users 4]

The default job's tiny policy is warm-started once (configs/grpo_tiny.py's 120 supervised
steps, warmstart.seed 0, no GRPO); every arm serves it from there (configs/online_tiny.py:
`rlcode serve` in one process and, in the online arms, `rlcode learn-online` in another).
`--users` simulated users (rlcode.serve.users) ask for k candidates of a training task of
data/tiny_tasks.jsonl, pick one by their hidden utility (tests passed, similarity, length;
Plackett-Luce noise) or reject them all (an outside option), and report it. An
interaction is accepted when a served candidate was picked. Writes results/online/
users_learn/ (result.json, learning_curve.png, manifest.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import numpy as np

from experiments.lib import ROOT, results, stats
from experiments.lib.serving import Process
from rlcode.data import jsonl
from rlcode.serve import users as users_lib

CONFIG = os.path.join(ROOT, "configs", "online_tiny.py")
MODEL = "rlcode-tiny"


def warm_start(out: str) -> str:
  """The warm-started policy's checkpoint directory (made once)."""
  workdir = os.path.join(out, "warm")
  path = os.path.join(workdir, "warm_start")
  if not os.path.isdir(path):
    subprocess.run([sys.executable, "-m", "rlcode", "train", "--config",
                    os.path.join(ROOT, "configs", "grpo_tiny.py:references"),
                    f"--config.workdir={workdir}",
                    "--config.train.steps=0", "--config.train.eval_every=0",
                    "--config.warmstart.seed=0", "--config.train.progress_bar=false"],
                   cwd=ROOT, check=True)
  return path


def run_arm(out, warm, seed, k, arm, seconds, n_users, tasks) -> dict:
  workdir = os.path.join(out, f"s{seed}_k{k}_{arm}")
  flags = [f"--config.workdir={workdir}", f"--config.online.init_from={warm}",
           f"--config.seed={seed}", "--config.train.progress_bar=false"]
  server = Process([sys.executable, "-m", "rlcode", "serve", "--config", CONFIG, *flags,
                    "--port", "0"], os.path.join(out, f"s{seed}_k{k}_{arm}.serve.log"))
  learner = None
  try:
    url = server.wait_for("listening on ").split("listening on ")[1].split()[0]
    if arm == "online":
      learner = Process([sys.executable, "-m", "rlcode", "learn-online", "--config", CONFIG,
                         *flags], os.path.join(out, f"s{seed}_k{k}_{arm}.learn.log"))
    users = users_lib.Users(tasks=tasks, model=MODEL, k=k, max_tokens=40)
    start = time.time()
    done = asyncio.run(users_lib.run(users, url, concurrency=n_users, seconds=seconds,
                                     seed=seed))
  finally:
    if learner is not None:
      learner.stop()
    server.stop()
  rows = [{"t": d.time - start, "accepted": d.accepted, "version": d.policy_version,
           "passed": d.passed} for d in done]
  return {"seed": seed, "k": k, "arm": arm, "interactions": rows,
          "acceptance": float(np.mean([r["accepted"] for r in rows])) if rows else 0.0,
          "last_third": float(np.mean([r["accepted"] for r in rows if r["t"] > seconds * 2 / 3]
                                      or [0.0])),
          "versions": max((r["version"] for r in rows), default=0)}


def summary(arms, seconds) -> dict:
  out = {}
  for k in sorted({a["k"] for a in arms}):
    row = {}
    for key in ("acceptance", "last_third"):
      by = {arm: {a["seed"]: a[key] for a in arms if a["k"] == k and a["arm"] == arm}
            for arm in ("frozen", "online")}
      seeds = sorted(set(by["frozen"]) & set(by["online"]))
      for arm in ("frozen", "online"):
        row[f"{key}/{arm}"] = stats.mean_se([by[arm][s] for s in seeds])
      row[f"{key}/online-frozen"] = stats.mean_se([by["online"][s] - by["frozen"][s]
                                                   for s in seeds])
    row["interactions"] = {arm: float(np.mean([len(a["interactions"]) for a in arms
                                                if a["k"] == k and a["arm"] == arm]))
                           for arm in ("frozen", "online")}
    row["versions_reached"] = float(np.mean([a["versions"] for a in arms
                                             if a["k"] == k and a["arm"] == "online"]))
    out[f"k={k}"] = row
  out["seconds_per_arm"] = seconds
  return out


def plot(arms, seconds, path, bins=6):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  ks = sorted({a["k"] for a in arms})
  fig, axes = plt.subplots(1, len(ks), figsize=(5 * len(ks), 3.5), squeeze=False)
  edges = np.linspace(0, seconds, bins + 1)
  for ax, k in zip(axes[0], ks):
    for arm, style in (("frozen", "--"), ("online", "-")):
      curves = []
      for a in (a for a in arms if a["k"] == k and a["arm"] == arm):
        t = np.array([r["t"] for r in a["interactions"]])
        acc = np.array([r["accepted"] for r in a["interactions"]], float)
        curves.append([acc[(t >= lo) & (t < hi)].mean() if ((t >= lo) & (t < hi)).any()
                       else np.nan for lo, hi in zip(edges[:-1], edges[1:])])
      curves = np.array(curves)
      mean = np.nanmean(curves, 0)
      se = np.nanstd(curves, 0) / np.sqrt(max(len(curves), 1))
      mid = (edges[:-1] + edges[1:]) / 2
      ax.plot(mid, mean, style, label=arm)
      ax.fill_between(mid, mean - se, mean + se, alpha=0.2)
    ax.set_title(f"{k} candidate{'s' if k > 1 else ''} per prompt")
    ax.set_xlabel("seconds")
    ax.set_ylabel("acceptance")
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--ks", default="1,3")
  parser.add_argument("--seconds", type=float, default=90.0)
  parser.add_argument("--users", type=int, default=4)
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "out", "online"))
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  warm = warm_start(args.out)
  tasks = jsonl.read_jsonl_tasks(os.path.join(ROOT, "data", "tiny_tasks.jsonl"),
                                 jsonl.JsonlTasks.HELD_OUT_FRACTION)["train"]
  arms = []
  progress = os.path.join(args.out, "arms.json")
  if os.path.exists(progress):
    import json
    with open(progress) as f:
      arms = json.load(f)
  for seed in map(int, args.seeds.split(",")):
    for k in map(int, args.ks.split(",")):
      for arm in ("frozen", "online"):
        if any(a["seed"] == seed and a["k"] == k and a["arm"] == arm for a in arms):
          continue
        arms.append(run_arm(args.out, warm, seed, k, arm, args.seconds, args.users, tasks))
        results.write_json(arms, progress)
        print(f"seed {seed} k={k} {arm}: acceptance {arms[-1]['acceptance']:.3f} "
              f"(last third {arms[-1]['last_third']:.3f}, {len(arms[-1]['interactions'])} "
              f"interactions, version {arms[-1]['versions']})", flush=True)
  png = os.path.join(args.out, "learning_curve.png")
  plot(arms, args.seconds, png)
  payload = {"summary": summary(arms, args.seconds), "arms": arms}
  print(payload["summary"])
  results.write("online", "users_learn", payload, files=[png])


if __name__ == "__main__":
  main()
