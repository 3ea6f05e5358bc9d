"""agent_tiny's RL gain over seeds, against a cross-entropy control, held out once.

For each seed:
1. GRPO: `rlcode train --config configs/agent_tiny.py --config.seed=S` in its own
   workdir (a fresh process, timed with its CPU seconds and the load average). Its eval
   rows are on the validation split (the one the config was tuned on).
2. Cross-entropy control: from the same warm-started policy (WORKDIR/warm_start),
   more supervised steps on the expert episodes of the training tasks for as much
   training time as the GRPO phase spent (rollout + update seconds, and the expert
   rows' log-prob pass with rl.expert_slots), at the GRPO optimizer's learning rate
   held constant.
3. The held-out split, once: eval/success and eval/tool_calls_per_episode of the
   warm-started policy, of the GRPO policy and of the control.

    python experiments/agent_tiny_seeds.py [--seeds 0 1 2] [--arms grpo ce]
        [--no-held-out] [--out experiments/out/agent_tiny_seeds] [--warm-start-from OUT]
        [--plain] [--config.a.b=value ...]

--plain runs the config as it was before the stale notes (PLAIN below); the sections of
experiments/README.md written before 2026-12-04 need it to reproduce.
--no-held-out with --arms grpo is the tuning mode (validation only). --warm-start-from
runs an arm that differs only after the warm start (its minutes are then the GRPO
phase's alone). Prints a table with mean and standard error over seeds; writes
agent_tiny_seeds.json and agent_tiny_seeds.png (validation success against step, one
line per seed) under --out. experiments/agent_tools.py and agent_think.py run their
variants with `run_arm`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlcode.config import loader
from rlcode.parallel import sharding
from rlcode import optim  # noqa: E402
from rlcode.agent import episodes
from rlcode.agent import demos
from rlcode.agent import evaluate
from rlcode.agent import groups  # noqa: E402
from rlcode.data import sources  # noqa: E402
from rlcode.runs.metrics import read_metrics  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "agent_tiny.py")
# configs/agent_tiny.py before the stale notes (2026-12-04): the plain tasks, the perfect
# expert, 600 warm-start steps, GRPO on every training task at lr 1e-4 for 20 steps.
# The sections of experiments/README.md written before then ran with these settings;
# agent_tools.py and agent_think.py pin them so that their tables still reproduce.
PLAIN = ["--config.data.path=data/agent_tasks.jsonl", "--config.warmstart.note_trust=0.0",
         "--config.warmstart.steps=600", "--config.rl.exclude_task_ids=",
         "--config.optimizer.learning_rate=1e-4", "--config.train.steps=20",
         "--config.train.eval_every=10", "--config.train.checkpoint_every=10"]


def mean_se(xs):
  m = sum(xs) / len(xs)
  if len(xs) < 2:
    return m, float("nan")
  var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
  return m, math.sqrt(var / len(xs))


def load(seed, overrides):
  return loader.load_config(CONFIG, [f"--config.seed={seed}", *overrides])


def run_arm(seed, workdir, overrides, warm_start_from=None):
  """One training run in a fresh process; its validation curve and costs. With
  `warm_start_from` (another run's workdir of the same seed and model) the run starts
  from that run's warm start instead of making its own: an arm that differs only after
  the warm start, at the cost of its GRPO phase alone."""
  flags = [f"--config.seed={seed}", f"--config.workdir={workdir}",
           "--config.train.progress_bar=false", *overrides]
  if warm_start_from is not None and not os.path.isdir(os.path.join(workdir, "checkpoints")):
    source = os.path.join(warm_start_from, "warm_start")
    if not os.path.isdir(source):
      raise SystemExit(f"--warm-start-from: {source} does not exist")
    shutil.copytree(source, os.path.join(workdir, "warm_start"))
    shutil.copytree(source, os.path.join(workdir, "checkpoints"))
    loader.write_run_config(loader.load_config(CONFIG, flags), workdir)
  cmd = [sys.executable, "-m", "rlcode", "train", "--config", CONFIG, *flags]
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  load_before, start = os.getloadavg()[0], time.time()
  subprocess.run(cmd, cwd=ROOT, check=True)
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  rows = read_metrics(workdir)
  steps = [r for r in rows if "loss" in r]
  evals = [r for r in rows if "eval/success" in r]
  return {"minutes": (time.time() - start) / 60,
          "cpu_minutes": (after.ru_utime + after.ru_stime - before.ru_utime
                          - before.ru_stime) / 60,
          "load": [load_before, os.getloadavg()[0]],
          "train_seconds": sum(r["rollout_seconds"] + r["update_seconds"]
                               + r.get("expert_logprob_seconds", 0.0) for r in steps),
          "val_steps": [r["step"] for r in evals],
          "val_success": [r["eval/success"] for r in evals],
          "val_tool_calls": [r["eval/tool_calls_per_episode"] for r in evals],
          "val_context_tokens": [r["eval/context_tokens"] for r in evals]}


def held_out(config, directory, mesh):
  model, tokenizer, _ = evaluate.restore_policy(config, directory, mesh)
  return evaluate.evaluate_policy(config, model, tokenizer, "held_out", mesh)


def control(config, workdir, seconds, mesh):
  """Cross-entropy on the warm start's episodes (the expert's, and the guesses of
  warmstart.guess_fraction) from the run's warm start for `seconds`."""
  from flax import nnx
  model, tokenizer, _ = evaluate.restore_policy(config, os.path.join(workdir, "warm_start"),
                                                   mesh)
  chat = episodes.chat_format(config, tokenizer)
  envs = episodes.make_envs(config, 16)
  tasks = step_groups.select_variants(config, sources.load(config.data, config.data.train_split))
  trajs = demos.demonstrations(config, tasks, envs, chat, episodes.budgets(config.agent))
  for env in envs:
    env.close()
  graphdef, params = nnx.split(model, nnx.Param)
  opt = dataclasses.replace(optim.OptimizerConfig.from_config(config.optimizer),
                            end_lr_fraction=1.0)
  params, stats = demos.imitate(graphdef, params, trajs, tokenizer.pad_id, mesh,
                                      optimizer=opt, batch_size=config.warmstart.batch_size,
                                      seed=config.seed + 2, seconds=seconds)
  return nnx.merge(graphdef, params), tokenizer, stats


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--arms", nargs="+", default=["grpo", "ce"], choices=["grpo", "ce"])
  parser.add_argument("--no-held-out", action="store_true",
                      help="tuning mode: report the validation split only")
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments/out/agent_tiny_seeds"))
  parser.add_argument("--warm-start-from", default=None, metavar="OUT",
                      help="start each seed from OUT/seedS/warm_start (an earlier run of this "
                           "script) instead of a warm start of its own")
  parser.add_argument("--plain", action="store_true",
                      help="the config as it was before the stale notes (PLAIN: the plain "
                           "tasks, the perfect expert), as the sections of "
                           "experiments/README.md written before 2026-12-04 ran it")
  args, overrides = parser.parse_known_args()
  if args.plain:
    overrides = [*PLAIN, *overrides]
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "agent_tiny_seeds.json")
  runs = []
  for seed in args.seeds:
    workdir = os.path.join(args.out, f"seed{seed}")
    source = (None if args.warm_start_from is None
              else os.path.join(args.warm_start_from, f"seed{seed}"))
    run = {"seed": seed, **run_arm(seed, workdir, overrides, source)}
    config = load(seed, overrides)
    mesh = sharding.mesh_from_config(config.mesh)
    if not args.no_held_out:
      run["held_out"] = {"warm_start": held_out(config, os.path.join(workdir, "warm_start"),
                                                mesh),
                         "grpo": held_out(config, workdir, mesh)}
    if "ce" in args.arms:
      policy, tokenizer, stats = control(config, workdir, run["train_seconds"], mesh)
      stats["val"] = evaluate.evaluate_policy(config, policy, tokenizer, "validation", mesh)
      if not args.no_held_out:
        run["held_out"]["ce"] = evaluate.evaluate_policy(config, policy, tokenizer,
                                                            "held_out", mesh)
      run["ce"] = stats
    runs.append(run)
    with open(path, "w") as f:
      json.dump({"runs": runs, "overrides": overrides}, f, indent=2)

  print("| seed | val first | val last | val gain | tool calls first | last"
        + ("" if args.no_held_out else " | held warm | held grpo | held ce") +
        " | minutes | CPU minutes | load |")
  for r in runs:
    r["val_gain"] = r["val_success"][-1] - r["val_success"][0]
    line = (f"| {r['seed']} | {r['val_success'][0]:.3f} | {r['val_success'][-1]:.3f} | "
            f"{r['val_gain']:+.3f} | {r['val_tool_calls'][0]:.2f} | {r['val_tool_calls'][-1]:.2f}")
    if not args.no_held_out:
      h = r["held_out"]
      line += (f" | {h['warm_start']['success']:.3f} | {h['grpo']['success']:.3f} | "
               f"{h['ce']['success'] if 'ce' in h else float('nan'):.3f}")
    print(line + f" | {r['minutes']:.1f} | {r['cpu_minutes']:.1f} | "
          f"{r['load'][0]:.1f}-{r['load'][1]:.1f} |")
  summary = {"val_gain": mean_se([r["val_gain"] for r in runs])}
  if not args.no_held_out:
    h = lambda r, arm: r["held_out"][arm]["success"]
    summary["held_out_grpo_gain"] = mean_se([h(r, "grpo") - h(r, "warm_start") for r in runs])
    if "ce" in args.arms:
      summary["held_out_ce_gain"] = mean_se([h(r, "ce") - h(r, "warm_start") for r in runs])
      summary["held_out_grpo_minus_ce"] = mean_se([h(r, "grpo") - h(r, "ce") for r in runs])
  for name, (m, se) in summary.items():
    print(f"{name}: {m:+.3f} ± {se:.3f} (mean ± standard error over {len(runs)} seeds)")
  with open(path, "w") as f:
    json.dump({"runs": runs, "summary": summary, "overrides": overrides}, f, indent=2)

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for r in runs:
    ax.plot(r["val_steps"], r["val_success"], marker="o", label=f"seed {r['seed']}")
  ax.set_xlabel("GRPO step")
  ax.set_ylabel("validation eval/success")
  m, se = summary["val_gain"]
  ax.set_title(f"agent_tiny: validation gain {m:+.3f} ± {se:.3f}")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "agent_tiny_seeds.png"), dpi=110)


if __name__ == "__main__":
  main()
