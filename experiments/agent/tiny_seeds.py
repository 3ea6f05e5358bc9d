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
3. The held-out split, read once: eval/success and eval/tool_calls_per_episode of the
   warm-started policy, of the GRPO policy and of the control.

    python -m experiments.agent.tiny_seeds [--seeds 0 1 2] [--arms grpo ce]
        [--no-held-out] [--out experiments/out/agent_tiny_seeds] [--warm-start-from OUT]
        [--plain] [--name agent_tiny_seeds] [--config.a.b=value ...]

--plain runs the config as it was before the stale notes (experiments.lib.agent.PLAIN);
the agent results recorded before 2026-12-04 (results/agent/) need it to reproduce.
--no-held-out with --arms grpo is the tuning mode (validation only). --warm-start-from
runs an arm that differs only after the warm start (its minutes are then the GRPO
phase's alone). Prints a table with mean and standard error over seeds. The runs and
agent_tiny_seeds.json (rewritten as seeds finish) stay under --out; the result, that
JSON and agent_tiny_seeds.png (validation success against step, one line per seed),
goes to results/agent/NAME.
"""

from __future__ import annotations

import os

from flax import nnx

from experiments.lib import plots, results, runs
from experiments.lib import agent as agent_lib
from experiments.lib.agent import PLAIN, evaluate_on, held_out, load, run_arm, split_tasks
from rlcode.agent import demos, episodes, step_groups
from rlcode.data import sources
from rlcode.parallel import sharding

NAN = float("nan")


def control(config, workdir, seconds, mesh):
  """Cross-entropy on the warm start's episodes (the expert's, and the guesses of
  agent.guess_fraction) from the run's warm start for `seconds`."""
  model, tokenizer, _, _ = runs.restore_policy(
      config, os.path.join(workdir, "warm_start"), mesh)
  chat = episodes.chat_format(config.agent, tokenizer)
  envs = agent_lib.make_envs(config, 16)
  tasks = step_groups.select_variants(config.agent.variants,
                                      sources.load(config.data, config.data.train_split))
  trajs = demos.demonstrations(config.agent, config.seed, tasks, envs, chat,
                               episodes.budgets(config.agent))
  for env in envs:
    env.close()
  graphdef, params = nnx.split(model, nnx.Param)
  params, stats_ = demos.imitate(graphdef, params, trajs, tokenizer.pad_id, mesh,
                                 optimizer=runs.constant_lr(config.optimizer),
                                 batch_size=config.warmstart.batch_size,
                                 seed=config.seed + 2, seconds=seconds)
  return nnx.merge(graphdef, params), tokenizer, stats_


def main():
  parser = runs.seed_parser(__doc__.splitlines()[0], "agent_tiny_seeds", "agent", control=True)
  parser.add_argument("--warm-start-from", default=None, metavar="OUT",
                      help="start each seed from OUT/seedS/warm_start (an earlier run of this "
                           "script) instead of a warm start of its own")
  parser.add_argument("--plain", action="store_true",
                      help="the config as it was before the stale notes (PLAIN: the plain "
                           "tasks, the perfect expert), as the results before 2026-12-04 "
                           "ran it")
  args, overrides = parser.parse_known_args()
  if args.plain:
    overrides = [*PLAIN, *overrides]
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "agent_tiny_seeds.json")
  found = []
  for seed in args.seeds:
    workdir = os.path.join(args.out, f"seed{seed}")
    source = (None if args.warm_start_from is None
              else os.path.join(args.warm_start_from, f"seed{seed}"))
    run = {"seed": seed, **run_arm(seed, workdir, overrides, source)}
    config = load(seed, overrides)
    mesh = sharding.mesh_from_config(config.mesh)
    if not args.no_held_out:
      held_tasks = split_tasks(config, "held_out")  # read once for the run's policies
      run["held_out"] = {"warm_start": held_out(config, os.path.join(workdir, "warm_start"),
                                                mesh, held_tasks),
                         "grpo": held_out(config, workdir, mesh, held_tasks)}
    if "ce" in args.arms:
      policy, tokenizer, ce = control(config, workdir, run["train_seconds"], mesh)
      ce["val"] = agent_lib.evaluate_split(config, policy, tokenizer, "validation", mesh)
      if not args.no_held_out:
        run["held_out"]["ce"] = evaluate_on(config, policy, tokenizer, held_tasks, mesh)
      run["ce"] = ce
    found.append(run)
    results.write_json({"runs": found, "overrides": overrides}, path)

  print("| seed | val first | val last | val gain | tool calls first | last"
        + ("" if args.no_held_out else " | held warm | held grpo | held ce") +
        " | minutes | CPU minutes | load |")
  for r in found:
    r["val_gain"] = r["val_success"][-1] - r["val_success"][0]
    line = (f"| {r['seed']} | {r['val_success'][0]:.3f} | {r['val_success'][-1]:.3f} | "
            f"{r['val_gain']:+.3f} | {r['val_tool_calls'][0]:.2f} | {r['val_tool_calls'][-1]:.2f}")
    if not args.no_held_out:
      h = r["held_out"]
      line += (f" | {h['warm_start']['success']:.3f} | {h['grpo']['success']:.3f} | "
               f"{h['ce']['success'] if 'ce' in h else NAN:.3f}")
    print(line + f" | {r['minutes']:.1f} | {r['cpu_minutes']:.1f} | "
          f"{r['load'][0]:.1f}-{r['load'][1]:.1f} |")
  held_of = None if args.no_held_out else (
      lambda arm: [r["held_out"][arm]["success"] for r in found])
  payload = runs.report_gains(found, held_of, control="ce" in args.arms, overrides=overrides,
                              path=path)

  m, se = payload["summary"]["val_gain"]
  png = plots.seed_curves(found, "val_success", ylabel="validation eval/success",
                          title=f"agent_tiny: validation gain {m:+.3f} ± {se:.3f}",
                          folder=results.folder("agent", args.name),
                          filename="agent_tiny_seeds.png")
  print("wrote", results.write("agent", args.name, payload,
                               config=load(args.seeds[0], overrides), files=[png]))


if __name__ == "__main__":
  main()
