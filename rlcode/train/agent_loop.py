"""GRPO over multi-turn tool-use trajectories, top to bottom.

    rlcode train --config configs/agent_tiny.py          # config.trainer = "agent"

Sections: mesh -> data -> model, optimiser, environments -> the run (fresh: a warm
start on scripted demonstrations; resumed: the latest checkpoint and the memory's notes)
-> sampler and update -> loop (episodes, rewards, update, log) with periodic evaluation
and checkpoints. A group is G episodes of one task; the update is
rlcode.rl.shared_prefix's (each task's prompt once) with the loss mask of
rlcode.agent.episodes (observations out of the loss).

With rl.expert_slots = k > 0 the last k episodes of each group are replaced by the task's
scripted expert episode (expert-guided groups: a plain form of LUFFY's off-policy
guidance, Yan et al. 2025, without its policy shaping); they are trained as on-policy
(old log-probs under the current policy), and the logged success is the sampled
episodes'. rl.drop_idle_groups runs only the groups whose rewards differ, with the loss
and gradient of the whole batch (rlcode.rl.shared_prefix.drop_idle_groups);
update_groups counts the groups the update ran. rl.curriculum = "signal" draws tasks by
family, weighted by the share of each family's recent groups with a signal
(rlcode.rl.curriculum; rows curriculum/<family>). rl.sample_rounds = n > 1 samples up to
n rounds a step and trains on the groups whose rewards differ (DAPO's dynamic sampling,
rlcode.rl.dynamic, shared with the GRPO loop).

Evaluation rows: eval/success (the share of episodes whose final reward reaches
agent.success_reward), eval/success/<family>, eval/tool_calls_per_episode and the other
means of rlcode.agent.episodes.episode_metrics (and the tool tasks' own,
rlcode.agent.expert.hint_metrics: eval/note/believed, eval/decoy/...).
"""

from __future__ import annotations

import math
import time

import numpy as np

from rlcode import optim
from rlcode.agent import demos, episodes, evaluate, expert, sampler, step_groups
from rlcode.agent.memory import Memory
from rlcode.config import loader
from rlcode.data import sources
from rlcode.data.stream import TaskStream
from rlcode.models.build import build_model
from rlcode.parallel import sharding
from rlcode.rl import algorithm, grpo, objective, shared_prefix
from rlcode.rl.curriculum import SignalCurriculum
from rlcode.runs import checkpoint
from rlcode.train import scaffold
from rlcode.policy import warm_start
from rlcode.policy.training import PolicyTraining


def train(config) -> list[dict]:
  """Runs config.train.steps GRPO steps over episodes; returns the metrics rows written."""
  config = loader.resolve(config)
  rl, agent = config.rl, config.agent
  n_rows = rl.prompts_per_step * rl.group_size

  # ══════════════════════════════════════════════════════════════ 1. mesh
  mesh = sharding.mesh_from_config(config.mesh)

  # ══════════════════════════════════════════════════════════════ 2. data
  train_tasks = step_groups.select_variants(agent.variants,
                                            sources.load(config.data, config.data.train_split))
  eval_tasks = step_groups.select_variants(agent.variants, sources.load_eval(config.data))
  # checked before the warm start
  stream_tasks = step_groups.grpo_tasks(rl.exclude_task_ids, train_tasks)

  # ══════════════════════════════════════════════════════════════ 3. model, optimiser, envs
  model, tokenizer = build_model(config.model, mesh, config.seed)
  chat = episodes.chat_format(agent, tokenizer)
  budgets = episodes.budgets(agent)
  embed = episodes.embedder(agent)
  memory = Memory(agent.memory_rule, embed=embed) if "memory" in agent.tools else None
  envs = episodes.make_envs(agent, n_rows, rewards_cfg=config.rewards,
                            reward_options=config.reward_options, memory=memory, embed=embed)
  eval_envs = episodes.make_envs(agent, config.eval.batch_prompts * config.eval.num_samples,
                                 embed=embed, scorer=envs[0].scorer)
  loss_cfg = algorithm.loss(rl, agent.max_total_tokens)
  keeps_reference = loss_cfg.uses_reference
  trained = PolicyTraining(model, config.optimizer, mesh, keeps_reference=keeps_reference,
                           base_reloads=bool(config.model.hf_path))
  graphdef, params, policy = trained.graphdef, trained.params, trained.model
  advantage_of = algorithm.advantages(rl)
  grpo.check_micro_batch_rows(rl.micro_batch_rows, sharding.batch_shards(mesh))
  # Kept groups: a multiple of the data-parallel devices, and of a micro-batch's groups.
  group_multiple = math.lcm(sharding.batch_shards(mesh),
                            (rl.micro_batch_rows or rl.group_size) // rl.group_size)
  signal_curriculum = rl.curriculum == "signal"

  with scaffold.Run(config, desc="agent grpo") as run, episodes.closing(envs + eval_envs):
    # ════════════════════════════════════════════════════════════ 4. fresh or resumed
    position, stream_state = 0, None
    if run.fresh:
      if config.warmstart.steps:
        params = demos.warm_start(config.warmstart, agent, graphdef, params, train_tasks, envs,
                                  chat, budgets, mesh, run.log, seed=config.seed,
                                  trainable=warm_start.warm_start_trainable(config.model),
                                  progress=config.train.progress_bar)
      state, ref_params = trained.fresh(params)
      if config.warmstart.steps:
        run.save_once(checkpoint.WARM_START, trained.bundle(state, ref_params),
                      {"data_position": 0, "seed": config.seed, "step": 0, "memory": []})
    else:
      restored, meta = run.restore(trained.abstract_bundle())
      (state, ref_params), position = trained.from_bundle(restored), meta["data_position"]
      stream_state = meta.get("curriculum")
      if memory is not None:
        memory.restore(meta["memory"])

    # ════════════════════════════════════════════════════════════ 5. sampler and update
    if signal_curriculum:
      stream = SignalCurriculum(stream_tasks, rl.prompts_per_step, config.seed,
                                decay=rl.curriculum_decay, floor=rl.curriculum_floor,
                                state=stream_state)
    else:
      stream = TaskStream(stream_tasks, rl.prompts_per_step, config.seed, position)
    example = shared_prefix.GroupedBatch.abstract(rl.prompts_per_step, n_rows)
    update = shared_prefix.update_step(graphdef, trained.optimizer, loss_cfg, mesh, state,
                                       example, trainable=trained.trainable,
                                       micro_batch_rows=rl.micro_batch_rows,
                                       dropout_seed=config.seed, offload=trained.offload)
    slots = rl.expert_slots
    # One compiled log-prob function: under the reference params and/or the current ones
    # (expert rows' old log-probs are the current policy's, so they train as on-policy).
    logprobs = (grpo.make_logprob_fn(graphdef, mesh, rl.temperature,
                                     shared_prefix.logprob_fn(rl.temperature))
                if keeps_reference or slots else None)

    def run_eval(step, params):
      result = evaluate.evaluate(config.eval, agent, policy(params), chat, eval_envs,
                                 eval_tasks, budgets, mesh, seed=config.seed)
      run.log(step, {f"eval/{k}": v for k, v in result.items()})

    def sample_round(step: int, r: int, timing: sampler.Timing
                     ) -> list[tuple[sampler.Trajectory, bool]]:
      """One round of the step's rollouts: G episodes of the stream's next tasks (expert
      slots filled when set), as (trajectory, is it the expert's) pairs, task-major."""
      tasks = stream.next()
      seed = step_groups.round_seed(config.seed, step, r)  # round 0: the plain loop's seed
      trajs = sampler.run_episodes(
          policy(state.params), chat, envs, tasks, group_size=rl.group_size, budgets=budgets,
          temperature=rl.temperature, seed=seed, mesh=mesh, workers=agent.workers,
          timing=timing)
      guided = np.zeros(len(trajs), bool)
      if slots:
        experts = [e if e is not None and not e.cut and e.reward >= agent.success_reward
                   else None for e in demos.expert_episodes(agent, config.seed, tasks, envs,
                                                            chat, budgets)]
        trajs, guided = step_groups.guide_groups(trajs, experts, rl.group_size, slots)
      return list(zip(trajs, guided))

    # ════════════════════════════════════════════════════════════ 6. loop
    if run.eval_at_start():
      run_eval(0, state.params)
    signal = lambda group: step_groups.has_signal(group, lambda item: item[0].reward)
    for step in run.steps():
      timing = sampler.Timing()
      start = time.perf_counter()
      picked, drawn, rounds_run = step_groups.fill_with_signal(
          lambda r: sample_round(step, r, timing), rl.group_size, rl.prompts_per_step,
          rl.sample_rounds, reward=lambda item: item[0].reward)
      drawn_groups = [drawn[i:i + rl.group_size] for i in range(0, len(drawn), rl.group_size)]
      if signal_curriculum:
        stream.record([g[0][0].task for g in drawn_groups], [signal(g) for g in drawn_groups])
      trajs = [t for t, _ in picked]
      guided = np.array([g for _, g in picked], bool)
      sampled = [t for t, g in drawn if not g]
      rollout_s = time.perf_counter() - start
      adv = advantage_of(np.array([t.reward for t in trajs], np.float32))
      batch = episodes.grpo_batch(trajs, rl.group_size, adv, pad_id=tokenizer.pad_id,
                                  max_len=agent.max_total_tokens, mask_cut=agent.mask_cut)
      if keeps_reference:
        batch.ref_logp = np.asarray(logprobs(trained.reference_params(ref_params, state), batch))
      logprob_s = 0.0
      if guided.any():  # the expert's tokens: old log-probs are the current policy's
        start = time.perf_counter()
        batch.old_logp = np.where(guided[:, None], np.asarray(logprobs(state.params, batch)),
                                  batch.old_logp)
        logprob_s = time.perf_counter() - start

      trained_tokens = float(batch.mask.sum() / len(trajs))
      if rl.drop_idle_groups:
        batch = shared_prefix.drop_idle_groups(batch, rl.group_size, loss_cfg,
                                               multiple=episodes.LENGTH_MULTIPLE,
                                               group_multiple=group_multiple)
      state, m, update_s = optim.run_passes(update, state, batch, rl.num_passes, step=step,
                                            on_nonfinite=config.train.on_nonfinite)

      row = {k: float(v) for k, v in m.items()}
      if not batch.mask.any():  # nothing trained: token means over no token are not logged
        row = {k: v for k, v in row.items() if k not in objective.TOKEN_MEANS}
      row.update(episodes.episode_metrics(sampled, agent.success_reward))
      row.update(expert.hint_metrics(sampled))
      if slots:
        row.update(expert_rows=float(guided.mean()), expert_logprob_seconds=logprob_s)
      if rl.sample_rounds > 1:
        row.update(sample_rounds=float(rounds_run), sampled_groups_with_signal=float(
            np.mean([signal(g) for g in drawn_groups])))
      row.update(
          groups_with_signal=float(np.mean(np.abs(adv.reshape(-1, rl.group_size)).max(1) > 0)),
          trained_tokens=trained_tokens, update_groups=float(len(batch.prompt_lengths)),
          rollout_seconds=rollout_s, update_seconds=update_s,
          sample_seconds=timing.sample, env_seconds=timing.env,
          prefill_tokens=float(timing.prefill_tokens),
          cached_tokens=float(timing.cached_tokens))
      if memory is not None:
        row["memory_notes"] = float(len(memory))
      if signal_curriculum:
        row.update({f"curriculum/{f}": float(w)
                    for f, w in zip(stream.families, stream.weights())})
      run.log(step + 1, row)
      run.postfix(success=row["success"], loss=row["loss"])

      done = step + 1
      if run.eval_due(done):
        run_eval(done, state.params)
      if run.save_due(done):
        meta = {"data_position": stream.position, "seed": config.seed, "step": done,
                "memory": list(memory.notes) if memory is not None else []}
        if signal_curriculum:
          meta["curriculum"] = stream.state()
        run.save(done, trained.bundle(state, ref_params), meta)
  return run.rows
