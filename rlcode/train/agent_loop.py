"""GRPO over multi-turn tool-use trajectories, top to bottom.

    rlcode train --config configs/agent_tiny.py

(`rlcode train` runs this loop for configs with an `agent` section.) Sections:
mesh -> data -> model, optimiser, checkpoint, environments (with a warm start on
scripted expert episodes) -> sampler and update -> loop (episodes, rewards,
update, log) with periodic evaluation -> save. A group is G episodes of one task;
the update is rlcode.shared_prefix's (each task's prompt once) with the loss mask
of rlcode.agent.rollout. Re-running the same command in the same workdir resumes
from the latest checkpoint; the memory's notes are saved with it.

With rl.expert_slots = k > 0 the last k episodes of each group are replaced by the
task's scripted expert episode (expert-guided groups: a plain form of LUFFY's
off-policy guidance, Yan et al. 2025, without its policy shaping). Where the policy
fails a task the expert's episode gets a positive advantage; where it succeeds every
reward is equal and nothing is pushed. The expert rows are trained as on-policy (old
log-probs under the current policy), and the logged success is the sampled episodes'.

The update skips what adds nothing to the loss (rl.drop_idle_groups, on unless set
False): groups none of whose rows adds anything (rewards all equal, or every trajectory
masked out whole) are dropped and the width is cut to the longest trained row, with the
loss and gradient of the whole batch (rlcode.shared_prefix.drop_idle_groups). The row
update_groups counts the groups the update ran (padded to a power of two),
trained_tokens the whole batch's trained tokens a trajectory; the update's token means
(ratio, clip_frac, entropy, kl) are over the kept rows, and a step with no group to train
logs none of them. rollout_shrinks counts the sampler's cuts of its batch to the live
rows (rlcode.agent.sampler.run_episodes).

With rl.curriculum = "signal" the tasks are drawn by family, each weighted by the share
of its recent groups whose rewards differed (rlcode.curriculum.SignalCurriculum; rows
curriculum/<family> log the weights; with rl.expert_slots a group's expert rows count,
so a family the policy fails and the expert solves has a signal); "" is the plain
seeded stream.

With rl.sample_rounds = n > 1 a step samples up to n rounds of prompts_per_step tasks and
trains on the groups whose rewards differ (DAPO's dynamic sampling, capped;
`fill_with_signal`), logging sample_rounds and sampled_groups_with_signal.

Evaluation rows: eval/success (the share of episodes whose final reward reaches
agent.success_reward), eval/success/<family> (the same per task family: file, search,
tests), eval/tool_calls_per_episode, and the other means of
rlcode.agent.rollout.episode_metrics, over config.eval.num_samples episodes of each
evaluation task.
"""

from __future__ import annotations

import os
import time
import jax
import numpy as np
from flax import nnx
from tqdm import tqdm
from rlcode.runs import checkpoint
from rlcode.config import loader
from rlcode.parallel import sharding
from rlcode.rl import shared_prefix
from rlcode import optim
from rlcode.rl import advantages
from rlcode.rl import grpo
from rlcode.rl import objective
from rlcode.agent import episodes, sampler
from rlcode.agent.memory import Memory
from rlcode.rl.curriculum import SignalCurriculum
from rlcode.data import sources
from rlcode.runs.metrics import MetricsWriter
from rlcode.models.build import build_model
from rlcode.data.stream import TaskStream
from rlcode.agent import demos
from rlcode.agent import evaluate
from rlcode.agent import step_groups


def train(config) -> list[dict]:
  """Runs config.train.steps GRPO steps over episodes; returns the metrics rows written."""
  rows: list[dict] = []
  rl, agent = config.rl, config.agent

  # ══════════════════════════════════════════════════════════════ 1. mesh
  mesh = sharding.mesh_from_config(config.mesh)
  if rl.top_p != 1.0 or rl.top_k != 0:
    raise ValueError("rl.top_p and rl.top_k must be off (1.0, 0): the update's log-ratio "
                     "assumes samples from the full tempered policy")

  # ══════════════════════════════════════════════════════════════ 2. data
  train_tasks = step_groups.select_variants(config, sources.load(config.data, config.data.train_split))
  eval_tasks = step_groups.select_variants(config, sources.load_eval(config.data))
  stream_tasks = step_groups.grpo_tasks(config, train_tasks)  # checked before the warm start

  # ══════════════════════════════════════════════════════════════ 3. model, optimiser, envs
  model, tokenizer = build_model(config.model, mesh, config.seed)
  chat = episodes.chat_format(config, tokenizer)
  budgets = episodes.budgets(agent)
  embed = episodes.embedder(agent)
  memory = Memory(agent.memory_rule, embed=embed) if "memory" in agent.tools else None
  envs = episodes.make_envs(config, rl.prompts_per_step * rl.group_size, memory=memory,
                           embed=embed)
  eval_envs = episodes.make_envs(config, config.eval.batch_prompts * config.eval.num_samples,
                                embed=embed, scorer=envs[0].scorer)
  graphdef, params = nnx.split(model, nnx.Param)
  policy = lambda params: nnx.merge(graphdef, params)
  optimizer = optim.make_optimizer(optim.OptimizerConfig.from_config(config.optimizer))
  loss_cfg = objective.LossConfig.from_config(rl, agent.max_total_tokens)
  advantage_of = advantages.advantages_from_config(rl)
  rounds = step_groups.sample_rounds(rl)  # checked before the warm start
  curriculum_kind = step_groups.curriculum_of(rl)  # likewise
  keeps_reference = loss_cfg.uses_reference
  ckpt = checkpoint.Checkpointer(os.path.join(config.workdir, "checkpoints"),
                                 keep=config.train.keep_checkpoints)
  start_step, position, stream_state = 0, 0, None
  if ckpt.latest_step() is None:
    metrics = MetricsWriter(config.workdir)
    loader.write_run_config(config, config.workdir)
    if config.warmstart.steps > 0:
      params = demos.warm_start(config, graphdef, params, train_tasks, envs, chat, budgets, mesh,
                          metrics)
    state = optim.init_state(policy(params), optimizer, mesh)
    ref_params = jax.tree.map(lambda x: x.copy(), params) if keeps_reference else {}
    if config.warmstart.steps > 0:
      checkpoint.save_once(os.path.join(config.workdir, checkpoint.WARM_START), 0,
                           {"state": state, "ref": ref_params},
                           {"data_position": 0, "seed": config.seed, "step": 0, "memory": []})
  else:
    loader.check_resume(config, config.workdir)
    restored, meta, start_step = ckpt.restore(
        checkpoint.bundle_like(optim.init_state(policy(params), optimizer, mesh), keeps_reference))
    state, ref_params, position = restored["state"], restored["ref"], meta["data_position"]
    stream_state = meta.get("curriculum")
    if memory is not None:
      memory.restore(meta.get("memory", []))
    metrics = MetricsWriter(config.workdir, resume_step=start_step)

  # ══════════════════════════════════════════════════════════════ 4. sampler and update
  n_rows = rl.prompts_per_step * rl.group_size
  if curriculum_kind == "signal":
    stream = SignalCurriculum(stream_tasks, rl.prompts_per_step, config.seed,
                              decay=rl.get("curriculum_decay", 0.8),
                              floor=rl.get("curriculum_floor", 0.05), state=stream_state)
  else:
    stream = TaskStream(stream_tasks, rl.prompts_per_step, config.seed, position)
  example = shared_prefix.GroupedBatch.abstract(rl.prompts_per_step, n_rows)
  update = shared_prefix.update_step(graphdef, optimizer, loss_cfg, mesh, state, example)
  # rl.drop_idle_groups: the update runs only the groups whose rewards differ (and no
  # trajectory cut and masked out sets the batch's width), with the same loss and
  # gradient as the whole batch (shared_prefix.drop_idle_groups).
  drop_idle = rl.get("drop_idle_groups", True)
  # rl.expert_slots > 0: expert-guided groups (guide_groups); their rows' old log-probs
  # are computed under the current policy, so the update treats them as on-policy.
  slots = rl.get("expert_slots", 0)
  step_groups.guide_groups([], [], rl.group_size, slots)  # checks the value before the first step
  # One compiled log-prob function: under the reference params and/or the current ones.
  logprobs = (grpo.make_logprob_fn(graphdef, mesh, rl.temperature,
                                   shared_prefix.logprob_fn(rl.temperature))
              if keeps_reference or slots else None)

  def run_eval(step, params):
    result = evaluate.evaluate(config, policy(params), chat, eval_envs, eval_tasks, budgets, mesh)
    rows.append(metrics.write(step, {f"eval/{k}": v for k, v in result.items()}))

  # ══════════════════════════════════════════════════════════════ 5. loop
  if start_step == 0 and config.train.eval_every:
    run_eval(0, state.params)
  bar = tqdm(range(start_step, config.train.steps), initial=start_step,
             total=config.train.steps, desc="agent grpo",
             disable=not config.train.progress_bar)

  def sample_round(step: int, r: int, timing: sampler.Timing
                   ) -> list[tuple[sampler.Trajectory, bool]]:
    """One round of the step's rollouts: G episodes of the stream's next tasks (expert
    slots filled when set), as (trajectory, is it the expert's) pairs, task-major."""
    tasks = stream.next()
    seed = config.seed * 1_000_003 + step + r * 104_729  # round 0: the plain loop's seed
    trajs = sampler.run_episodes(
        policy(state.params), chat, envs, tasks, group_size=rl.group_size, budgets=budgets,
        temperature=rl.temperature, seed=seed, mesh=mesh, workers=agent.workers,
        timing=timing)
    guided = np.zeros(len(trajs), bool)
    if slots:
      experts = [e if e is not None and not e.cut and e.reward >= agent.success_reward
                 else None for e in demos.expert_episodes(config, tasks, envs, chat, budgets)]
      trajs, guided = step_groups.guide_groups(trajs, experts, rl.group_size, slots)
    return list(zip(trajs, guided))

  for step in bar:
    timing = sampler.Timing()
    start = time.perf_counter()
    picked, drawn, rounds_run = step_groups.fill_with_signal(
        lambda r: sample_round(step, r, timing), rl.group_size, rl.prompts_per_step, rounds,
        reward=lambda item: item[0].reward)
    trajs = [t for t, _ in picked]
    if curriculum_kind:
      groups = [drawn[i:i + rl.group_size] for i in range(0, len(drawn), rl.group_size)]
      stream.record([g[0][0].task for g in groups],
                    [step_groups._has_signal(g, lambda item: item[0].reward) for g in groups])
    guided = np.array([g for _, g in picked], bool)
    sampled = [t for t, g in drawn if not g]
    rollout_s = time.perf_counter() - start
    scores = np.array([t.reward for t in trajs], np.float32)
    adv = advantage_of(scores)
    batch = episodes.grpo_batch(trajs, rl.group_size, adv, pad_id=tokenizer.pad_id,
                               max_len=agent.max_total_tokens, mask_cut=agent.mask_cut)
    if keeps_reference:
      batch.ref_logp = np.asarray(logprobs(ref_params, batch))
    logprob_s = 0.0
    if guided.any():  # the expert's tokens: old log-probs are the current policy's (ratio 1)
      start = time.perf_counter()
      batch.old_logp = np.where(guided[:, None], np.asarray(logprobs(state.params, batch)),
                                batch.old_logp)
      logprob_s = time.perf_counter() - start

    trained_tokens = float(batch.mask.sum() / len(trajs))
    if drop_idle:
      batch = shared_prefix.drop_idle_groups(batch, rl.group_size, loss_cfg,
                                             multiple=episodes.LENGTH_MULTIPLE,
                                             group_multiple=sharding.batch_shards(mesh))
    state, m, update_s = optim.run_passes(update, state, batch, rl.num_passes, step=step,
                                         on_nonfinite=config.train.on_nonfinite)

    row = {k: float(v) for k, v in m.items()}
    if not batch.mask.any():  # nothing trained: token means over no token are not logged
      row = {k: v for k, v in row.items() if k not in TOKEN_MEANS}
    row.update(episodes.episode_metrics(sampled, agent.success_reward))
    if slots:
      row.update(expert_rows=float(guided.mean()), expert_logprob_seconds=logprob_s)
    if rounds > 1:
      row.update(sample_rounds=float(rounds_run), sampled_groups_with_signal=float(
          np.mean([step_groups._has_signal(drawn[i:i + rl.group_size], lambda item: item[0].reward)
                   for i in range(0, len(drawn), rl.group_size)])))
    row.update(
        groups_with_signal=float(np.mean(np.abs(adv.reshape(-1, rl.group_size)).max(1) > 0)),
        trained_tokens=trained_tokens, update_groups=float(len(batch.prompt_lengths)),
        rollout_seconds=rollout_s, update_seconds=update_s,
        decode_seconds=timing.decode, extend_seconds=timing.extend,
        prefill_seconds=timing.prefill, env_seconds=timing.env,
        rollout_shrinks=float(timing.shrinks))
    if memory is not None:
      row["memory_notes"] = float(len(memory))
    if curriculum_kind:
      row.update({f"curriculum/{f}": float(w)
                  for f, w in zip(stream.families, stream.weights())})
    rows.append(metrics.write(step + 1, row))
    bar.set_postfix(success=f"{row['success']:.2f}", loss=f"{row['loss']:.3f}")

    done = step + 1
    if config.train.eval_every and (done % config.train.eval_every == 0
                                    or done == config.train.steps):
      run_eval(done, state.params)
    if done % config.train.checkpoint_every == 0 or done == config.train.steps:
      meta = {"data_position": stream.position, "seed": config.seed, "step": done,
              "memory": list(memory.notes) if memory is not None else []}
      if curriculum_kind:
        meta["curriculum"] = stream.state()
      ckpt.save(done, {"state": state, "ref": ref_params}, meta)

  # ══════════════════════════════════════════════════════════════ 6. save
  ckpt.wait()
  ckpt.close()
  metrics.close()
  for env in envs + eval_envs:
    env.close()
  return rows


# The update's metrics that are means over trained tokens (rlcode.grpo.policy_loss).
TOKEN_MEANS = ("ratio", "clip_frac", "entropy", "kl")
