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

import concurrent.futures
import os
import re
import time

import jax
import numpy as np
from flax import nnx
from tqdm import tqdm

from rlcode import checkpoint, config_lib, grpo, sft, sharding, shared_prefix
from rlcode.agent import expert, rollout, sampler
from rlcode.agent.memory import Memory
from rlcode.curriculum import SignalCurriculum
from rlcode.data import sources
from rlcode.errors import BadInput
from rlcode.metrics import MetricsWriter
from rlcode.models.build import build_model
from rlcode.rollout import TaskStream


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
  train_tasks = select_variants(config, sources.load(config.data, config.data.train_split))
  eval_tasks = select_variants(config, sources.load_eval(config.data))
  stream_tasks = grpo_tasks(config, train_tasks)  # checked before the warm start

  # ══════════════════════════════════════════════════════════════ 3. model, optimiser, envs
  model, tokenizer = build_model(config.model, mesh, config.seed)
  chat = rollout.chat_format(config, tokenizer)
  budgets = rollout.budgets(agent)
  embed = embedder(agent)
  memory = Memory(agent.memory_rule, embed=embed) if "memory" in agent.tools else None
  envs = rollout.make_envs(config, rl.prompts_per_step * rl.group_size, memory=memory,
                           embed=embed)
  eval_envs = rollout.make_envs(config, config.eval.batch_prompts * config.eval.num_samples,
                                embed=embed, scorer=envs[0].scorer)
  graphdef, params = nnx.split(model, nnx.Param)
  policy = lambda params: nnx.merge(graphdef, params)
  optimizer = grpo.make_optimizer(grpo.OptimizerConfig.from_config(config.optimizer))
  loss_cfg = grpo.LossConfig.from_config(rl, agent.max_total_tokens)
  advantages = grpo.advantages_from_config(rl)
  rounds = sample_rounds(rl)  # checked before the warm start
  curriculum_kind = curriculum_of(rl)  # likewise
  keeps_reference = loss_cfg.uses_reference
  ckpt = checkpoint.Checkpointer(os.path.join(config.workdir, "checkpoints"),
                                 keep=config.train.keep_checkpoints)
  start_step, position, stream_state = 0, 0, None
  if ckpt.latest_step() is None:
    metrics = MetricsWriter(config.workdir)
    config_lib.write_run_config(config, config.workdir)
    if config.warmstart.steps > 0:
      params = warm_start(config, graphdef, params, train_tasks, envs, chat, budgets, mesh,
                          metrics)
    state = grpo.init_state(policy(params), optimizer, mesh)
    ref_params = jax.tree.map(lambda x: x.copy(), params) if keeps_reference else {}
    if config.warmstart.steps > 0:
      checkpoint.save_once(os.path.join(config.workdir, checkpoint.WARM_START), 0,
                           {"state": state, "ref": ref_params},
                           {"data_position": 0, "seed": config.seed, "step": 0, "memory": []})
  else:
    config_lib.check_resume(config, config.workdir)
    restored, meta, start_step = ckpt.restore(
        checkpoint.bundle_like(grpo.init_state(policy(params), optimizer, mesh), keeps_reference))
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
  guide_groups([], [], rl.group_size, slots)  # checks the value before the first step
  # One compiled log-prob function: under the reference params and/or the current ones.
  logprobs = (grpo.make_logprob_fn(graphdef, mesh, rl.temperature,
                                   shared_prefix.logprob_fn(rl.temperature))
              if keeps_reference or slots else None)

  def run_eval(step, params):
    result = evaluate(config, policy(params), chat, eval_envs, eval_tasks, budgets, mesh)
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
                 else None for e in expert_episodes(config, tasks, envs, chat, budgets)]
      trajs, guided = guide_groups(trajs, experts, rl.group_size, slots)
    return list(zip(trajs, guided))

  for step in bar:
    timing = sampler.Timing()
    start = time.perf_counter()
    picked, drawn, rounds_run = fill_with_signal(
        lambda r: sample_round(step, r, timing), rl.group_size, rl.prompts_per_step, rounds,
        reward=lambda item: item[0].reward)
    trajs = [t for t, _ in picked]
    if curriculum_kind:
      groups = [drawn[i:i + rl.group_size] for i in range(0, len(drawn), rl.group_size)]
      stream.record([g[0][0].task for g in groups],
                    [_has_signal(g, lambda item: item[0].reward) for g in groups])
    guided = np.array([g for _, g in picked], bool)
    sampled = [t for t, g in drawn if not g]
    rollout_s = time.perf_counter() - start
    scores = np.array([t.reward for t in trajs], np.float32)
    adv = advantages(scores)
    batch = rollout.grpo_batch(trajs, rl.group_size, adv, pad_id=tokenizer.pad_id,
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
                                             multiple=rollout.LENGTH_MULTIPLE,
                                             group_multiple=sharding.batch_shards(mesh))
    state, m, update_s = grpo.run_passes(update, state, batch, rl.num_passes, step=step,
                                         on_nonfinite=config.train.on_nonfinite)

    row = {k: float(v) for k, v in m.items()}
    if not batch.mask.any():  # nothing trained: token means over no token are not logged
      row = {k: v for k, v in row.items() if k not in TOKEN_MEANS}
    row.update(rollout.episode_metrics(sampled, agent.success_reward))
    if slots:
      row.update(expert_rows=float(guided.mean()), expert_logprob_seconds=logprob_s)
    if rounds > 1:
      row.update(sample_rounds=float(rounds_run), sampled_groups_with_signal=float(
          np.mean([_has_signal(drawn[i:i + rl.group_size], lambda item: item[0].reward)
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


def evaluate(config, model, chat, envs, tasks, budgets, mesh) -> dict:
  """config.eval.num_samples episodes of every task, batch_prompts tasks at a time."""
  ev, agent = config.eval, config.agent
  trajs = []
  for start in range(0, len(tasks), ev.batch_prompts):
    chunk = tasks[start:start + ev.batch_prompts]
    trajs += sampler.run_episodes(
        model, chat, envs[:len(chunk) * ev.num_samples], chunk, group_size=ev.num_samples,
        budgets=budgets, temperature=ev.temperature, seed=config.seed + 7919 + start,
        mesh=mesh, workers=agent.workers, min_tasks=ev.batch_prompts)
  return {**rollout.episode_metrics(trajs, agent.success_reward), "n_tasks": len(tasks),
          "n_episodes": len(trajs)}


def expert_episodes(config, tasks, envs, chat, budgets, guess_fraction: float = 0.0,
                    guess_families: tuple[str, ...] | None = None, decoy_copy: float = 0.0,
                    note_trust: float = 0.0) -> list[sampler.Trajectory | None]:
  """One scripted expert episode per task, None where the tool set cannot solve it;
  played on the environments side by side, each taking every len(envs)-th episode.
  guess_fraction > 0: that fraction of the tasks (expert.is_guess, by the run's seed;
  of the `guess_families` only, when given) get the episode of a demonstrator that
  does not look (expert.guess_calls) instead. decoy_copy > 0: on that fraction of the
  tasks with a decoy line (expert.copies_decoy, by the run's seed) the episode copies
  the decoy's value. note_trust > 0: on that fraction of the tasks with a stale note
  (expert.trusts_note, by the run's seed) the episode writes the note's value at once
  (expert.note_calls)."""
  agent = config.agent
  jobs = []
  for i, task in enumerate(tasks):
    try:
      calls = expert.expert_calls(
          task, agent.toolset, agent.think,
          copy_decoy=expert.copies_decoy(task, decoy_copy, config.seed))
    except ValueError:
      continue
    if guess_fraction > 0 and expert.is_guess(task, guess_fraction, config.seed,
                                              guess_families):
      calls = expert.guess_calls(task, agent.toolset, config.seed)
    if expert.trusts_note(task, note_trust, config.seed):
      calls = expert.note_calls(task, agent.toolset)
    jobs.append((i, task, calls))
  out: list[sampler.Trajectory | None] = [None] * len(tasks)
  lanes = min(len(envs), len(jobs))

  def lane(k):
    for i, task, calls in jobs[k::lanes]:
      out[i] = expert.expert_trajectory(envs[k], chat, task, calls, budgets)

  with concurrent.futures.ThreadPoolExecutor(max(1, min(agent.workers, lanes))) as pool:
    list(pool.map(lane, range(lanes)))
  return out


def expert_trajectories(config, tasks, envs, chat, budgets, guess_fraction: float = 0.0,
                        guess_families: tuple[str, ...] | None = None,
                        decoy_copy: float = 0.0, note_trust: float = 0.0
                        ) -> list[sampler.Trajectory]:
  """The expert episodes of the tasks its tool set can solve, in task order
  (guess_fraction, guess_families, decoy_copy, note_trust: as in expert_episodes)."""
  return [t for t in expert_episodes(config, tasks, envs, chat, budgets, guess_fraction,
                                     guess_families, decoy_copy, note_trust)
          if t is not None]


def demonstrations(config, tasks, envs, chat, budgets) -> list[sampler.Trajectory]:
  """The warm start's episodes (and a cross-entropy control's): the expert's, with
  `warmstart.guess_fraction` of them (of the `warmstart.guess_families` only, when
  set) a demonstrator's that does not look, and on `warmstart.decoy_copy` of the tasks
  with a decoy line the decoy's value copied, and on `warmstart.note_trust` of the tasks
  with a stale note the note believed without a look."""
  ws = config.warmstart
  families = tuple(ws.get("guess_families", ())) or None
  unknown = set(families or ()) - set(expert.VARIANTS)
  if unknown:
    raise BadInput(f"warmstart.guess_families: unknown {sorted(unknown)}; "
                   f"known: {list(expert.VARIANTS)}")
  decoy_copy = ws.get("decoy_copy", 0.0)
  if not 0.0 <= decoy_copy <= 1.0:
    raise BadInput(f"warmstart.decoy_copy must be in [0, 1], got {decoy_copy}")
  note_trust = ws.get("note_trust", 0.0)
  if not 0.0 <= note_trust <= 1.0:
    raise BadInput(f"warmstart.note_trust must be in [0, 1], got {note_trust}")
  if note_trust > 0 and not any("note" in t.extra["hint"] for t in tasks):
    raise BadInput("warmstart.note_trust > 0 but no training task has a stale note: "
                   "use data/agent_tasks_notes.jsonl (python data/make_agent_tasks.py --notes)")
  return expert_trajectories(config, tasks, envs, chat, budgets,
                             ws.get("guess_fraction", 0.0), families, decoy_copy, note_trust)


def guide_groups(trajs, experts, group_size: int, slots: int):
  """Expert-guided groups: in each group of `group_size` sampled trajectories, the last
  `slots` are replaced by the task's expert episode (experts[g], or None: the group stays
  as sampled; the loop passes only experts that solved the task within the budgets).
  Returns (trajectories, guided: [N] bool, True on the expert rows)."""
  if not 0 <= slots < group_size:
    raise ValueError(f"rl.expert_slots must be in [0, group_size={group_size}), got {slots}: "
                     "a group needs at least one sampled trajectory")
  out, guided = list(trajs), np.zeros(len(trajs), bool)
  for g, episode in enumerate(experts):
    if episode is not None:
      for i in range((g + 1) * group_size - slots, (g + 1) * group_size):
        out[i], guided[i] = episode, True
  return out, guided


def sample_rounds(rl) -> int:
  """rl.sample_rounds (1 when absent), checked: at least 1."""
  rounds = rl.get("sample_rounds", 1)
  if not isinstance(rounds, int) or rounds < 1:
    raise BadInput(f"rl.sample_rounds must be an integer >= 1, got {rounds!r}")
  return rounds


# The update's metrics that are means over trained tokens (rlcode.grpo.policy_loss).
TOKEN_MEANS = ("ratio", "clip_frac", "entropy", "kl")

CURRICULA = ("", "signal")


def curriculum_of(rl) -> str:
  """rl.curriculum ("" when absent), checked: "" (the plain seeded stream) or "signal"
  (rlcode.curriculum.SignalCurriculum: families drawn by their recent groups with a
  signal), with rl.curriculum_decay in [0, 1) and rl.curriculum_floor in (0, 1]."""
  kind = rl.get("curriculum", "")
  if kind not in CURRICULA:
    raise BadInput(f"rl.curriculum={kind!r}; known: {list(CURRICULA)}")
  decay, floor = rl.get("curriculum_decay", 0.8), rl.get("curriculum_floor", 0.05)
  if not 0.0 <= decay < 1.0 or not 0.0 < floor <= 1.0:
    raise BadInput(f"rl.curriculum_decay={decay} must be in [0, 1) and rl.curriculum_floor="
                   f"{floor} in (0, 1]")
  return kind


def _has_signal(group, reward) -> bool:
  return len({reward(item) for item in group}) > 1


def fill_with_signal(sample_round, group_size: int, groups: int, rounds: int, *,
                     reward=lambda item: item.reward):
  """DAPO's dynamic sampling (Yu et al. 2025), with a cap on the rounds.

  sample_round(r) returns round r's items (`groups` groups of `group_size`, group-major;
  reward(item) is an item's final reward). Rounds run until `groups` groups whose
  rewards are not all equal have been kept, or `rounds` rounds have run. A batch still
  short then is filled with the last round's flat groups, whose advantages are 0 (with
  beta = 0 they add nothing to the gradient, as in plain GRPO). rounds = 1 is plain
  GRPO: the first round's groups as they came.

  Returns (the batch's items, groups * group_size of them; every item drawn, in order;
  the rounds run).
  """
  kept, drawn = [], []
  for r in range(rounds):
    items = sample_round(r)
    if len(items) != groups * group_size:
      raise ValueError(f"round {r}: {len(items)} items, expected {groups} x {group_size}")
    drawn += items
    if rounds == 1:
      return items, drawn, 1
    flat = []
    for i in range(0, len(items), group_size):
      chunk = items[i:i + group_size]
      (kept if _has_signal(chunk, reward) else flat).append(chunk)
    if len(kept) >= groups:
      break
  batch = (kept + flat)[:groups]
  return [item for chunk in batch for item in chunk], drawn, r + 1


def warm_start(config, graphdef, params, tasks, envs, chat, budgets, mesh, metrics):
  """Supervised steps on scripted expert episodes of the training tasks (their calls are
  the targets, observations are not); returns the params and logs one step-0 row."""
  ws = config.warmstart
  start = time.perf_counter()
  # warmstart.max_episodes > 0: only the first that many training tasks (quick runs).
  tasks = tasks[:ws.get("max_episodes", 0) or None]
  trajs = demonstrations(config, tasks, envs, chat, budgets)
  expert_s = time.perf_counter() - start
  solved = float(np.mean([t.reward >= config.agent.success_reward for t in trajs]))
  params, stats = imitate(graphdef, params, trajs, chat.tokenizer.pad_id, mesh,
                          optimizer=grpo.OptimizerConfig.from_config(ws.optimizer),
                          batch_size=ws.batch_size, seed=config.seed + 1, steps=ws.steps,
                          progress=config.train.progress_bar)
  metrics.write(0, {"sft_loss_first": stats["loss_first"], "sft_loss_last": stats["loss_last"],
                    "sft_steps": ws.steps, "expert_episodes": len(trajs),
                    "expert_success": solved, "expert_seconds": expert_s})
  return params


def imitate(graphdef, params, trajs, pad_id, mesh, *, optimizer: grpo.OptimizerConfig,
            batch_size: int, seed: int, steps: int | None = None,
            seconds: float | None = None, progress: bool = False, on_step=None):
  """Cross-entropy on the sampled (expert) tokens of `trajs`, batches drawn with
  replacement: `steps` steps, or steps until `seconds` of training time were spent (a
  control at another run's training time). on_step: as in sft.train_on_batches.
  Returns the params and {"steps", "seconds", "loss_first", "loss_last",
  "target_tokens"}."""
  rng = np.random.default_rng(seed)

  def next_batch():
    pick = rng.choice(len(trajs), batch_size, replace=len(trajs) < batch_size)
    return rollout.sft_batch([trajs[i] for i in pick], pad_id)
  return sft.train_on_batches(graphdef, params, next_batch, mesh, optimizer=optimizer,
                              batch_size=batch_size, steps=steps, seconds=seconds,
                              progress=progress, desc="imitate", on_step=on_step)


def restore_policy(config, path: str, mesh):
  """(model, tokenizer, step) of the latest checkpoint under `path` (a workdir, its
  checkpoints/ directory, or its warm_start/ directory)."""
  nested = os.path.join(path, "checkpoints")
  directory = nested if os.path.isdir(nested) else path
  model, tokenizer = build_model(config.model, mesh, config.seed)
  optimizer = grpo.make_optimizer(grpo.OptimizerConfig.from_config(config.optimizer))
  with_ref = grpo.LossConfig.from_config(config.rl, config.agent.max_total_tokens).uses_reference
  with checkpoint.Checkpointer(directory) as ckpt:
    restored, _, step = ckpt.restore(
        checkpoint.bundle_like(grpo.init_state(model, optimizer, mesh), with_ref))
  graphdef, _ = nnx.split(model, nnx.Param)
  return nnx.merge(graphdef, restored["state"].params), tokenizer, step


def evaluate_policy(config, model, tokenizer, split: str, mesh) -> dict:
  """`evaluate` of a policy on a split of config.data (variants as config.agent.variants)."""
  tasks = select_variants(config, sources.load(config.data, split))
  chat = rollout.chat_format(config, tokenizer)
  envs = rollout.make_envs(config, config.eval.batch_prompts * config.eval.num_samples,
                           embed=embedder(config.agent))
  try:
    return evaluate(config, model, chat, envs, tasks, rollout.budgets(config.agent), mesh)
  finally:
    for env in envs:
      env.close()


def grpo_tasks(config, tasks):
  """The training tasks GRPO samples: all, less those whose id matches the regular
  expression rl.exclude_task_ids (for example "^agent/practice/": practice tasks that
  are there to teach the warm start to copy). The warm start uses every task."""
  pattern = config.rl.get("exclude_task_ids", "")
  if not pattern:
    return list(tasks)
  try:
    regex = re.compile(pattern)
  except re.error as e:
    raise BadInput(f"rl.exclude_task_ids={pattern!r} is not a regular expression: {e}") from None
  kept = [t for t in tasks if not regex.search(t.id)]
  if not kept:
    raise BadInput(f"rl.exclude_task_ids={pattern!r} excludes all {len(tasks)} training tasks")
  return kept


def select_variants(config, tasks):
  """The tasks of the variants config.agent.variants names (all when it is empty)."""
  keep = tuple(config.agent.get("variants", ()))
  if not keep:
    return list(tasks)
  return [t for t in tasks if t.extra.get("hint", {}).get("variant") in keep]


def embedder(agent):
  """MiniLM embeddings for semantic search when agent.semantic_search, else None."""
  if not agent.semantic_search:
    return None
  from rlcode.rewards import semantic
  return lambda texts: semantic.embed(list(texts))
