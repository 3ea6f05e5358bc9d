"""The default job's RL gain over seeds, against a cross-entropy control, held out once.

For each seed:
1. GRPO: `rlcode train --config configs/grpo_tiny.py --config.seed=S` in its own
   workdir (a fresh process). Its periodic eval rows are on the validation split
   (the one hyperparameters were tuned on).
2. Cross-entropy control: from the same warm-started policy (WORKDIR/warm_start),
   supervised steps on the training split's reference solutions (every one the
   warm start had: the tests-only tasks have none) for as much training time as the
   GRPO phase spent (rollout + reward + update seconds), at the GRPO optimizer's
   learning rate held constant.
3. The held-out split, read once the design was fixed: pass@1 of the warm-started
   policy, of the GRPO policy and of the control (config.eval: its samples per problem
   at the rollout temperature, unbiased pass@1), and over training time: GRPO's
   checkpoints and the control's parameters at the same training seconds
   (grpo_tiny_held_out.png).

    python -m experiments.grpo.tiny_seeds [--seeds 0 1 2] [--arms grpo ce] [--no-held-out]
        [--out experiments/out/grpo_tiny_seeds] [--name grpo_tiny_seeds]
        [--variant references] [--config.a.b=value ...]

    python -m experiments.grpo.tiny_seeds --combine OUT1/grpo_tiny_seeds.json ... --name N

--combine makes one result of seeds that ran as separate processes side by side (each with
one --seeds and its own --out): their runs are read, nothing is run again.
--no-held-out with --arms grpo is the tuning mode (validation only). Prints a table
with mean and standard error over seeds. The runs and grpo_tiny_seeds.json (rewritten
as seeds finish) stay under --out; the result (the same JSON and grpo_tiny_seeds.png,
validation pass@1 against step, one line per seed) goes to results/grpo/NAME/.
Extra --config.a.b=value arguments go to every run.
"""

from __future__ import annotations

import json
import os
import time

import jax
from flax import nnx

from experiments.lib import ROOT, heldout, plots, results, runs, stats
from rlcode.config import loader
from rlcode.data import sources
from rlcode.parallel import sharding
from rlcode.policy import sft

CONFIG = os.path.join(ROOT, "configs", "grpo_tiny.py")
NAN = float("nan")


def load(seed, overrides):
  """configs/grpo_tiny.py with the seed and overrides."""
  return loader.load_config(CONFIG, [f"--config.seed={seed}", *overrides])


def grpo_arm(seed, workdir, overrides):
  """The GRPO run in a fresh process: its minutes, training seconds, validation curve and
  checkpoints (every one kept: the held-out curve reads them)."""
  run = runs.train_process(CONFIG, [f"--config.seed={seed}", f"--config.workdir={workdir}",
                                    "--config.train.progress_bar=false",
                                    "--config.train.keep_checkpoints=1000", *overrides], workdir)
  evals = runs.eval_rows(run["rows"], "eval/pass@1")
  steps = runs.step_rows(run["rows"])
  rewards = [r["reward_mean"] for r in steps]
  every = load(seed, overrides).train.checkpoint_every
  return {"minutes": run["minutes"],
          "train_seconds": runs.train_seconds(steps),
          # The training seconds spent up to each checkpoint (its step: the key).
          "checkpoint_seconds": {r["step"]: runs.train_seconds(steps[:i + 1])
                                 for i, r in enumerate(steps) if r["step"] % every == 0},
          # The rollouts' mean reward over the first and the last ten steps.
          "reward_first10": sum(rewards[:10]) / len(rewards[:10]),
          "reward_last10": sum(rewards[-10:]) / len(rewards[-10:]),
          "val_steps": [r["step"] for r in evals],
          "val_pass@1": [r["eval/pass@1"] for r in evals]}


def control_arm(config, workdir, seconds, mesh, marks=()):
  """Cross-entropy from the run's warm start on the training references (all it can use:
  the tests-only tasks have none) for `seconds` of training: (policy, tokenizer, stats,
  {mark: params at the first step that reached `mark` seconds}), the clock started
  before the optimiser is built, as the budget's is."""
  model, tokenizer, _, _ = runs.restore_policy(config, os.path.join(workdir, "warm_start"),
                                                      mesh)
  graphdef, params = nnx.split(model, nnx.Param)
  references = sources.with_references(sources.load(config.data, config.data.train_split))
  at, start = {}, time.perf_counter()

  def keep(step, params, loss):
    now = time.perf_counter() - start
    for mark in marks:
      if mark not in at and now >= mark:
        at[mark] = jax.tree.map(lambda x: x.copy(), params)

  params, stats_ = sft.run(graphdef, params, references,
                           tokenizer, mesh, optimizer=runs.constant_lr(config.optimizer),
                           batch_size=config.warmstart.batch_size, seed=config.seed + 2,
                           seconds=seconds, on_step=keep)
  for mark in marks:  # a mark the budget ended before: the last params
    at.setdefault(mark, params)
  return (nnx.merge(graphdef, params), tokenizer, stats_,
          {m: nnx.merge(graphdef, p) for m, p in at.items()})


def _combined(paths):
  """(runs, overrides) of several progress files; their overrides must agree."""
  runs_, overrides = [], None
  for path in paths:
    with open(path) as f:
      part = json.load(f)
    if overrides is not None and part["overrides"] != overrides:
      raise SystemExit(f"{path}: overrides {part['overrides']} differ from {overrides}")
    overrides = part["overrides"]
    runs_ += part["runs"]
  return sorted(runs_, key=lambda r: r["seed"]), overrides


def main():
  parser = runs.seed_parser(__doc__.splitlines()[0], "grpo_tiny_seeds", "grpo", control=True)
  parser.add_argument("--variant", default=None,
                      help="configs/grpo_tiny.py's argument (references: the job before "
                           "2026-12-05, which the LoRA result ran)")
  parser.add_argument("--combine", nargs="+", default=[], metavar="JSON",
                      help="the grpo_tiny_seeds.json of runs made apart: one result of them")
  args, overrides = parser.parse_known_args()
  global CONFIG
  if args.variant:
    CONFIG = f"{CONFIG}:{args.variant}"
  os.makedirs(args.out, exist_ok=True)
  progress = os.path.join(args.out, "grpo_tiny_seeds.json")
  found = []
  if args.combine:
    found, overrides = _combined(args.combine)
    args.seeds = [r["seed"] for r in found]
    args.arms = ["grpo", "ce"] if all("ce" in r for r in found) else ["grpo"]
    args.no_held_out = not all("held_out" in r for r in found)
  for seed in [] if args.combine else args.seeds:
    workdir = os.path.join(args.out, f"seed{seed}")
    run = {"seed": seed, **grpo_arm(seed, workdir, overrides)}
    config = load(seed, overrides)
    mesh = sharding.mesh_from_config(config.mesh)
    marks = sorted(run["checkpoint_seconds"].items())  # (step, training seconds)
    if not args.no_held_out:
      # read once for the run's policies
      held_tasks = heldout.read(config, "held_out")[:config.data.max_eval_tasks]
      run["held_out"] = {
          "warm_start": runs.restored_pass_at_1(config, os.path.join(workdir, "warm_start"),
                                                held_tasks, mesh),
          "grpo": runs.restored_pass_at_1(config, workdir, held_tasks, mesh)}
      # Over training time: GRPO's checkpoints and the control at the same seconds.
      last = max((step for step, _ in marks), default=None)  # the latest: "grpo" above
      run["held_out_curve"] = {"seconds": [0.0] + [sec for _, sec in marks],
                               "grpo": [run["held_out"]["warm_start"]] + [
                                   run["held_out"]["grpo"] if step == last else
                                   runs.restored_pass_at_1(config, workdir, held_tasks, mesh,
                                                           step=step)
                                   for step, _ in marks]}
    if "ce" in args.arms:
      seconds = [sec for _, sec in marks] if not args.no_held_out else []
      policy, tokenizer, ce, at = control_arm(config, workdir, run["train_seconds"], mesh,
                                              seconds)
      ce["val_pass@1"] = runs.pass_at_1(config, policy, tokenizer,
                                        sources.load_eval(config.data), mesh)
      if not args.no_held_out:
        run["held_out"]["ce"] = runs.pass_at_1(config, policy, tokenizer, held_tasks, mesh)
        run["held_out_curve"]["ce"] = [run["held_out"]["warm_start"]] + [
            runs.pass_at_1(config, at[sec], tokenizer, held_tasks, mesh) for sec in seconds]
      run["ce"] = ce
    found.append(run)
    results.write_json({"runs": found, "overrides": overrides}, progress)

  print(f"{'seed':>4s} {'val first':>9s} {'val last':>8s} {'val gain':>8s}"
        + ("" if args.no_held_out else
           f" {'held warm':>9s} {'held grpo':>9s} {'held ce':>7s}") + f" {'minutes':>7s}")
  for r in found:
    r["val_gain"] = r["val_pass@1"][-1] - r["val_pass@1"][0]
    line = f"{r['seed']:4d} {r['val_pass@1'][0]:9.3f} {r['val_pass@1'][-1]:8.3f} {r['val_gain']:+8.3f}"
    if not args.no_held_out:
      h = r["held_out"]
      line += f" {h['warm_start']:9.3f} {h['grpo']:9.3f} {h.get('ce', NAN):7.3f}"
    print(line + f" {r['minutes']:7.1f}")
  held_of = None if args.no_held_out else (lambda arm: [r["held_out"][arm] for r in found])
  payload = runs.report_gains(found, held_of, control="ce" in args.arms, overrides=overrides,
                              path=progress)

  m, se = payload["summary"]["val_gain"]
  files = [plots.seed_curves(found, "val_pass@1", ylabel="validation pass@1",
                             title=f"grpo_tiny: validation gain {m:+.3f} ± {se:.3f}",
                             folder=results.folder("grpo", args.name),
                             filename="grpo_tiny_seeds.png")]
  if all("held_out_curve" in r and "ce" in r["held_out_curve"] for r in found):
    files.append(held_out_plot(found, results.folder("grpo", args.name)))
  print("wrote", results.write("grpo", args.name, payload,
                               config=load(args.seeds[0], overrides), files=files))


def held_out_plot(found, folder):
  """Held-out pass@1 against training seconds after the warm start, both arms: the mean
  over seeds at each GRPO checkpoint (x: the seeds' mean seconds), ± one standard error."""
  fig, ax = plots.pyplot().subplots(figsize=(6, 4))
  points = min(len(r["held_out_curve"]["seconds"]) for r in found)
  x = [stats.mean_se([r["held_out_curve"]["seconds"][i] for r in found])[0] / 60
       for i in range(points)]
  for arm, label in (("grpo", "GRPO on every task's tests"),
                     ("ce", "cross-entropy on the references (control)")):
    mean_se = [stats.mean_se([r["held_out_curve"][arm][i] for r in found])
               for i in range(points)]
    ax.errorbar(x, [m for m, _ in mean_se], yerr=[se for _, se in mean_se], marker="o",
                capsize=3, label=label)
  ax.set_xlabel("training minutes after the warm start")
  ax.set_ylabel("held-out pass@1")
  ax.set_title(f"grpo_tiny: held out, mean ± SE over {len(found)} seeds")
  ax.grid(alpha=0.3)
  ax.legend()
  return plots.save(fig, folder, "grpo_tiny_held_out.png")


if __name__ == "__main__":
  main()
