"""What a GRPO step of configs/agent_tiny.py costs with and without skipping idle work in
the update: only the groups whose rewards differ, cut to the longest trained row
(`shared_prefix.drop_idle_groups`, the config's `rl.drop_idle_groups`) against the whole
batch; exact (the same loss and gradient), timed side by side on the same batches. (The
rollouts skip idle rows by themselves: the engine steps only the busy ones.)

For each of `--batches` batches of the config's training tasks (rl.prompts_per_step x
rl.group_size episodes, its budgets and temperature, played by the policy in
`--policy`, a run's warm_start/ or checkpoints/ directory) the rollouts run once; then
the update runs on the batch both ways, each from the same copy of the optimiser state.
The first
`--warmup` batches are left out of the totals: they compile most of the shapes (the
totals with them are printed as well).

    python -m experiments.agent.step_speed --policy OUT/seed0/warm_start [--batches 12]
        [--warmup 2] [--name agent_step_speed] [--config.a.b=value ...]

The config runs with the settings its tables were made with
(experiments.lib.agent.PLAIN). Prints a table, the load average and the grep-able line
`speedup agent step: Nx (rollout Nx, update Nx)`; writes results/agent/NAME.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np
from flax import nnx

from experiments.lib import results, runs
from experiments.lib import agent as agent_lib
from experiments.lib.agent import CONFIG, PLAIN  # PLAIN: the settings its tables were made with
from rlcode import optim
from rlcode.agent import episodes as rollout, sampler
from rlcode.config import loader
from rlcode.data import sources
from rlcode.data.stream import TaskStream
from rlcode.parallel import sharding
from rlcode.rl import algorithm, shared_prefix


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--policy", required=True, help="a run's warm_start/ (or checkpoints/)")
  parser.add_argument("--batches", type=int, default=12)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--name", default="agent_step_speed",
                      help="the result's name under results/agent/")
  args, overrides = parser.parse_known_args()
  if not os.path.isdir(args.policy):
    raise SystemExit(f"--policy: {args.policy} is not a directory")
  config = loader.load_config(CONFIG, [*PLAIN, *overrides])
  rl, agent = config.rl, config.agent
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer, _, _ = runs.restore_policy(config, args.policy, mesh)
  chat = rollout.chat_format(agent, tokenizer)
  envs = agent_lib.make_envs(config, rl.prompts_per_step * rl.group_size)
  budgets = rollout.budgets(agent)
  stream = TaskStream(sources.load(config.data, config.data.train_split),
                      rl.prompts_per_step, config.seed)
  graphdef, params = nnx.split(model, nnx.Param)
  optimizer = optim.make_optimizer(optim.OptimizerConfig.from_config(config.optimizer))
  loss_cfg = algorithm.loss(rl, agent.max_total_tokens)
  advantage_of = algorithm.advantages(rl)
  state = optim.init_state(nnx.merge(graphdef, params), optimizer, mesh)
  example = shared_prefix.GroupedBatch.abstract(rl.prompts_per_step,
                                                rl.prompts_per_step * rl.group_size)
  update = shared_prefix.update_step(graphdef, optimizer, loss_cfg, mesh, state, example)

  rows, load_before = [], os.getloadavg()
  for i in range(args.batches):
    tasks = stream.next()
    start = time.perf_counter()
    trajs = sampler.run_episodes(model, chat, envs, tasks, group_size=rl.group_size,
                                 budgets=budgets, temperature=rl.temperature,
                                 seed=config.seed * 1_000_003 + i, mesh=mesh,
                                 workers=agent.workers)
    rollout_s = time.perf_counter() - start
    adv = advantage_of(np.array([t.reward for t in trajs], np.float32))
    whole = rollout.grpo_batch(trajs, rl.group_size, adv, pad_id=tokenizer.pad_id,
                               max_len=agent.max_total_tokens, mask_cut=agent.mask_cut)
    dropped = shared_prefix.drop_idle_groups(whole, rl.group_size, loss_cfg,
                                             multiple=rollout.LENGTH_MULTIPLE)
    update_s, losses = {}, {}
    for name, batch in (("whole", whole), ("dropped", dropped)):
      copy = jax.tree.map(lambda x: x.copy(), state)
      start = time.perf_counter()
      _, m = update(copy, batch)
      losses[name] = float(jax.device_get(m["loss"]))
      update_s[name] = time.perf_counter() - start
    rows.append({
        "batch": i, "rollout": rollout_s, "update_dropped": update_s["dropped"],
        "update_whole": update_s["whole"], "loss_dropped": losses["dropped"],
        "loss_whole": losses["whole"], "groups_kept": int(dropped.prompt_tokens.shape[0]),
        "width_whole": int(whole.mask.shape[1]), "width_dropped": int(dropped.mask.shape[1]),
        "groups_with_signal": float(np.mean(np.abs(adv.reshape(-1, rl.group_size)).max(1) > 0)),
    })
    r = rows[-1]
    print(f"batch {i}: rollout {r['rollout']:.1f} s; update {r['update_dropped']:.2f} s on "
          f"{r['groups_kept']} groups x {r['width_dropped']} / {r['update_whole']:.2f} s on "
          f"{rl.prompts_per_step} x {r['width_whole']}; loss {r['loss_dropped']:.6f} / "
          f"{r['loss_whole']:.6f}", flush=True)
  load_after = os.getloadavg()

  def total(key, skip):
    """The seconds of `key` over the batches after the first `skip`."""
    return sum(r[key] for r in rows[skip:])

  print(f"\n{rl.prompts_per_step} tasks x {rl.group_size} episodes a batch, policy "
        f"{args.policy}; CPU")
  print("| batches | rollout s | update s: dropped / whole | ratio | step s: dropped / whole "
        "| ratio |")
  print("|---|---:|---:|---:|---:|---:|")
  summary = {}
  for skip, label in ((args.warmup, f"{args.warmup + 1}-{args.batches} (compiled)"),
                      (0, f"1-{args.batches} (with compiling)")):
    ro = total("rollout", skip)
    up = (total("update_dropped", skip), total("update_whole", skip))
    step = (ro + up[0], ro + up[1])
    summary[label] = {"rollout": ro, "update": up, "step": step}
    print(f"| {label} | {ro:.1f} | {up[0]:.1f} / {up[1]:.1f} | {up[1] / up[0]:.2f}x | "
          f"{step[0]:.1f} / {step[1]:.1f} | {step[1] / step[0]:.2f}x |")
  print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f}")
  s = summary[f"{args.warmup + 1}-{args.batches} (compiled)"]
  print(f"speedup agent step: {s['step'][1] / s['step'][0]:.2f}x (update "
        f"{s['update'][1] / s['update'][0]:.2f}x)")
  print("wrote", results.write("agent", args.name, {
      "rows": rows, "summary": summary, "load": [load_before, load_after],
      "policy": args.policy, "overrides": overrides}, config=config))


if __name__ == "__main__":
  main()
