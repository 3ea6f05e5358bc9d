"""The GRPO training loop, top to bottom.

    rlcode train --config configs/grpo_tiny.py

Sections: mesh -> data -> model, optimiser and checkpoint -> sampler -> loop
(rollout, reward, update, log) with periodic evaluation -> save. Re-running the
same command in the same workdir resumes from the latest checkpoint, and the
metrics of the remaining steps equal those of an uninterrupted run.

An experiment that needs a different loop copies this file into experiments/
rather than growing flags here.
"""

from __future__ import annotations

import os
import time

import jax
import numpy as np
from flax import nnx
from tqdm import tqdm

from rlcode import checkpoint, evaluate, grpo, rollout, sft, sharding, shared_prefix
from rlcode.data import sources
from rlcode.metrics import MetricsWriter
from rlcode.models.build import build_model


def train(config) -> list[dict]:
  """Runs config.train.steps GRPO steps; returns the rows written to metrics.jsonl."""
  rows: list[dict] = []
  rl = config.rl

  # ══════════════════════════════════════════════════════════════ 1. mesh
  mesh = sharding.mesh_from_config(config.mesh)
  n_rows = rl.prompts_per_step * rl.group_size
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  if n_rows % dp:
    raise ValueError(f"rl.prompts_per_step * rl.group_size = {n_rows} rows do not split "
                     f"over the {dp} data-parallel devices of the mesh")
  if rl.top_p != 1.0 or rl.top_k != 0:
    raise ValueError("rl.top_p and rl.top_k must be off (1.0, 0): the update's log-ratio "
                     "assumes samples from the full tempered policy")

  # ══════════════════════════════════════════════════════════════ 2. data
  train_tasks = sources.load(config.data, config.data.train_split)
  eval_tasks = _eval_tasks(config)

  # ══════════════════════════════════════════════════════════════ 3. model, optimiser, checkpoint
  model, tokenizer = build_model(config.model, mesh, config.seed)
  train_tasks, fit_train = _fit(config, "train", train_tasks, tokenizer, model.cfg.max_seq_len,
                                rl.max_new_tokens)
  eval_tasks, fit_eval = _fit(config, "eval", eval_tasks, tokenizer, model.cfg.max_seq_len,
                              config.eval.max_new_tokens)
  graphdef, params = nnx.split(model, nnx.Param)
  policy = lambda params: nnx.merge(graphdef, params)
  optimizer = grpo.make_optimizer(config.optimizer)
  ckpt = checkpoint.Checkpointer(os.path.join(config.workdir, "checkpoints"),
                                 keep=config.train.keep_checkpoints)
  start_step, position = 0, 0
  if ckpt.latest_step() is None:
    metrics = MetricsWriter(config.workdir)
    if config.warmstart.steps > 0:
      params = warm_start(config, graphdef, params, train_tasks, tokenizer, mesh, metrics)
    if config.data.get("drop_too_long"):
      metrics.write(0, {**fit_train, **fit_eval})
    state = grpo.init_state(policy(params), optimizer, mesh)
    ref_params = jax.tree.map(lambda x: x.copy(), params) if _keeps_reference(rl) else {}
  else:
    restored, meta, start_step = ckpt.restore(
        _abstract_bundle(policy(params), optimizer, mesh, _keeps_reference(rl)))
    if meta["seed"] != config.seed:
      raise ValueError(f"{ckpt.directory} was written with seed {meta['seed']}, "
                       f"not config.seed={config.seed}; use another workdir")
    state, ref_params, position = restored["state"], restored["ref"], meta["data_position"]
    metrics = MetricsWriter(config.workdir, resume_step=start_step)

  # ══════════════════════════════════════════════════════════════ 4. sampler and update
  stream = rollout.TaskStream(train_tasks, rl.prompts_per_step, config.seed, position)
  loss_cfg = grpo.LossConfig.from_config(rl, rl.max_new_tokens)
  # rl.shared_prefix: each group's prompt runs once in the update (rlcode.shared_prefix).
  logprob_fn = shared_prefix.logprob_fn(rl.temperature) if rl.shared_prefix else None
  update, ref_logprobs = None, None

  def run_eval(step, params):
    result = held_out_eval(config, policy(params), tokenizer, eval_tasks, mesh)
    rows.append(metrics.write(step, {f"eval/{k}": v for k, v in result.items()}))

  # ══════════════════════════════════════════════════════════════ 5. loop
  if start_step == 0 and config.train.eval_every:
    run_eval(0, state.params)
  bar = tqdm(range(start_step, config.train.steps), initial=start_step,
             total=config.train.steps, desc="grpo", disable=not config.train.progress_bar)
  for step in bar:
    tasks = stream.next()
    ro = rollout.sample(policy(state.params), tokenizer, tasks, group_size=rl.group_size,
                        max_new_tokens=rl.max_new_tokens, temperature=rl.temperature,
                        seed=config.seed * 1_000_003 + step, mesh=mesh)
    start = time.perf_counter()
    reward = rollout.score(ro, dict(config.rewards), _options(config))
    reward_s = time.perf_counter() - start
    adv = grpo.group_advantages(reward.scores, rl.group_size, rl.advantage)
    if rl.shared_prefix:
      batch = shared_prefix.rl_batch(ro, adv, tokenizer.pad_id, rl.max_new_tokens)
    else:
      batch = rollout.rl_batch(ro, adv, tokenizer.pad_id)
    if update is None:
      update = grpo.make_update_step(graphdef, optimizer, loss_cfg, mesh, state, batch,
                                     logprob_fn=logprob_fn)
      if _keeps_reference(rl):
        ref_logprobs = grpo.make_logprob_fn(graphdef, mesh, rl.temperature, logprob_fn)
    if ref_logprobs is not None:
      batch.ref_logp = np.asarray(ref_logprobs(ref_params, batch))

    start = time.perf_counter()
    for _ in range(rl.num_passes):
      state, m = update(state, batch)
    m = jax.device_get(m)
    update_s = time.perf_counter() - start
    if m["skipped"] and config.train.on_nonfinite == "stop":
      raise FloatingPointError(f"step {step}: non-finite loss or gradient "
                               f"(loss={m['loss']}, grad_norm={m['grad_norm']})")

    gen = ro.generation
    n_tokens = int(gen.lengths.sum())
    row = {k: float(v) for k, v in m.items()}
    row.update(
        reward_mean=float(reward.scores.mean()), reward_std=float(reward.scores.std()),
        pass_rate=float(np.mean([_passed(d) for d in reward.details])) if reward.details else 0.0,
        groups_with_signal=float(np.mean(np.abs(adv.reshape(-1, rl.group_size)).max(1) > 0)),
        completion_len=float(gen.lengths.mean()),
        rollout_tokens_per_s=n_tokens / ro.seconds,
        update_tokens_per_s=_batch_tokens(batch) * rl.num_passes / update_s,
        tokens_per_s=n_tokens / (ro.seconds + update_s),
        rollout_seconds=ro.seconds, reward_seconds=reward_s, update_seconds=update_s,
        **{f"reward/{k}": v for k, v in reward.metrics.items()})
    rows.append(metrics.write(step + 1, row))
    bar.set_postfix(reward=f"{row['reward_mean']:.3f}", loss=f"{row['loss']:.3f}")

    done = step + 1
    if config.train.eval_every and (done % config.train.eval_every == 0
                                    or done == config.train.steps):
      run_eval(done, state.params)
    if done % config.train.checkpoint_every == 0 or done == config.train.steps:
      ckpt.save(done, {"state": state, "ref": ref_params},
                {"data_position": stream.position, "seed": config.seed, "step": done})

  # ══════════════════════════════════════════════════════════════ 6. save
  ckpt.wait()
  ckpt.close()
  metrics.close()
  return rows


def warm_start(config, graphdef, params, tasks, tokenizer, mesh, metrics):
  """Supervised steps on reference solutions; returns the params (logs one step-0 row)."""
  ws = config.warmstart
  optimizer = grpo.make_optimizer(ws.optimizer)
  state = grpo.init_state(nnx.merge(graphdef, params), optimizer, mesh)
  stream = rollout.TaskStream(tasks, ws.batch_size, config.seed + 1)
  step_fn = None
  losses = []
  for i in tqdm(range(ws.steps), desc="warm start", disable=not config.train.progress_bar):
    batch = rollout.sft_batch(tokenizer, stream.next())
    if step_fn is None:
      step_fn = sft.make_sft_step(graphdef, optimizer, mesh, state, batch)
    state, m = step_fn(state, batch)
    losses.append(m["sft_loss"])
  losses = [float(x) for x in jax.device_get(losses)]
  metrics.write(0, {"sft_loss_first": losses[0], "sft_loss_last": losses[-1],
                    "sft_steps": ws.steps})
  return state.params


def _keeps_reference(rl) -> bool:
  """A frozen copy of the warm-started policy is kept for the KL term or the kl metric."""
  return grpo.LossConfig.from_config(rl, rl.max_new_tokens).uses_reference


def _abstract_bundle(model, optimizer, mesh, with_ref: bool) -> dict:
  """The shapes and shardings of what a checkpoint holds, for restoring into."""
  state = grpo.init_state(model, optimizer, mesh)
  return {"state": checkpoint.abstract_like(state),
          "ref": checkpoint.abstract_like(state.params) if with_ref else {}}


def evaluate_checkpoint(config, path: str, ks=(1,)) -> dict:
  """Held-out evaluation (config.eval, config.data.eval_split) of a saved policy.

  `path` is a workdir or its checkpoints/ directory; the latest step is used.
  """
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer, step, directory = restore_policy(config, path, mesh)
  eval_tasks, _ = _fit(config, "eval", _eval_tasks(config), tokenizer, model.cfg.max_seq_len,
                       config.eval.max_new_tokens)
  result = held_out_eval(config, model, tokenizer, eval_tasks, mesh, ks=ks)
  return {"step": step, "checkpoint": directory, **result}


def restore_policy(config, path: str, mesh):
  """(model, tokenizer, step, checkpoint directory) of the latest checkpoint under `path`.

  `path` is a workdir or its checkpoints/ directory.
  """
  directory = path if os.path.basename(os.path.normpath(path)) == "checkpoints" else (
      os.path.join(path, "checkpoints"))
  ckpt = checkpoint.Checkpointer(directory)
  if ckpt.latest_step() is None:
    raise FileNotFoundError(f"no checkpoint under {directory}")
  model, tokenizer = build_model(config.model, mesh, config.seed)
  graphdef, _ = nnx.split(model, nnx.Param)
  restored, _, step = ckpt.restore(_abstract_bundle(
      model, grpo.make_optimizer(config.optimizer), mesh, _keeps_reference(config.rl)))
  ckpt.close()
  return nnx.merge(graphdef, restored["state"].params), tokenizer, step, directory


def _eval_tasks(config) -> list:
  tasks = sources.load(config.data, config.data.eval_split)
  return tasks[:config.data.max_eval_tasks] if config.data.max_eval_tasks else tasks


def _fit(config, split: str, tasks: list, tokenizer, max_seq_len: int,
         max_new_tokens: int) -> tuple[list, dict]:
  """The tasks that fit the context (rollout.fit_context) and "data/<split>_*" counts.

  Tasks that do not fit are an error unless config.data.drop_too_long is set;
  then they are dropped, and the counts go into metrics.jsonl at step 0.
  """
  kept, counts = rollout.fit_context(tasks, tokenizer, max_seq_len=max_seq_len,
                                     max_new_tokens=max_new_tokens)
  dropped = len(tasks) - len(kept)
  where = (f"the model's context of {max_seq_len} tokens with max_new_tokens={max_new_tokens} "
           f"({counts})")
  if dropped and not config.data.get("drop_too_long"):
    raise ValueError(f"{dropped} of {len(tasks)} {split} tasks do not fit {where}; shorten "
                     "them or set --config.data.drop_too_long=true to drop and count them")
  if not kept:
    raise ValueError(f"none of the {len(tasks)} {split} tasks fits {where}")
  return kept, {f"data/{split}_{k}": v for k, v in counts.items()}


def held_out_eval(config, model, tokenizer, tasks, mesh, ks=None) -> dict:
  """pass@k for code tasks with tests; the configured rewards' means otherwise."""
  ev = config.eval
  common = dict(num_samples=ev.num_samples, temperature=ev.temperature,
                max_new_tokens=ev.max_new_tokens, seed=config.seed + 7919,
                batch_prompts=ev.batch_prompts, mesh=mesh)
  if all(t.kind == "code" and t.tests for t in tasks):
    return evaluate.evaluate_policy(model, tokenizer, tasks, ks=tuple(ks or ev.ks),
                                    reward_options=_options(config).get("tests", {}), **common)
  return evaluate.evaluate_rewards(model, tokenizer, tasks, weights=dict(config.rewards),
                                   options=_options(config), **common)


def _batch_tokens(batch) -> int:
  """Token positions the update computes (each group's prompt once when shared)."""
  if isinstance(batch, shared_prefix.GroupedBatch):
    return batch.prompt_tokens.size + batch.completion_tokens.size
  return batch.tokens.size


def _options(config) -> dict:
  return {name: dict(opts) for name, opts in config.reward_options.items()}


def _passed(detail: dict) -> bool:
  tests = detail.get("tests")
  return bool(tests and tests.get("status") == "passed")
