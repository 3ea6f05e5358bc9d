"""The GRPO training loop, top to bottom.

    rlcode train --config configs/grpo_tiny.py

Sections: mesh -> data -> model, optimiser and checkpoint -> sampler -> loop
(rollout, reward, update, log) with periodic evaluation -> save. Re-running the
same command in the same workdir resumes from the latest checkpoint, and the
metrics of the remaining steps equal those of an uninterrupted run.

Evaluation: every `train.eval_every` steps on `data.eval_split` (rows "eval/...",
the split to tune on). With `data.test_split` set, the first and the last
evaluation also cover that split (rows "test/..."): the held-out result of a
configuration once it is tuned, before and after RL; leave it empty while tuning.

An experiment that needs a different loop copies this file into experiments/
rather than growing flags here.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import jax
import numpy as np
from flax import nnx
from tqdm import tqdm

from rlcode import checkpoint, config_lib, evaluate, grpo, rewards, rollout, sft, sharding, shared_prefix
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
  eval_tasks = sources.load_eval(config.data)
  test_split = config.data.get("test_split") or ""
  test_tasks = sources.load(config.data, test_split) if test_split else []

  # ══════════════════════════════════════════════════════════════ 3. model, optimiser, checkpoint
  model, tokenizer = build_model(config.model, mesh, config.seed)
  drop = bool(config.data.get("drop_too_long"))
  train_tasks, fit_train = rollout.fit_tasks(train_tasks, tokenizer, split="train",
                                             max_seq_len=model.cfg.max_seq_len,
                                             max_new_tokens=rl.max_new_tokens, drop_too_long=drop)
  eval_tasks, fit_eval = rollout.fit_tasks(eval_tasks, tokenizer, split="eval",
                                           max_seq_len=model.cfg.max_seq_len,
                                           max_new_tokens=config.eval.max_new_tokens,
                                           drop_too_long=drop)
  fit_test = {}
  if test_split:
    test_tasks, fit_test = rollout.fit_tasks(test_tasks, tokenizer, split="test",
                                             max_seq_len=model.cfg.max_seq_len,
                                             max_new_tokens=config.eval.max_new_tokens,
                                             drop_too_long=drop)
  multiple = int(rl.get("length_multiple", rollout.LENGTH_MULTIPLE))
  graphdef, params = nnx.split(model, nnx.Param)
  policy = lambda params: nnx.merge(graphdef, params)
  optimizer = grpo.make_optimizer(grpo.OptimizerConfig.from_config(config.optimizer))
  loss_cfg = grpo.LossConfig.from_config(rl, rl.max_new_tokens)
  keeps_reference = loss_cfg.uses_reference
  ckpt = checkpoint.Checkpointer(os.path.join(config.workdir, "checkpoints"),
                                 keep=config.train.keep_checkpoints)
  start_step, position = 0, 0
  if ckpt.latest_step() is None:
    metrics = MetricsWriter(config.workdir)
    config_lib.write_run_config(config, config.workdir)
    fit_warm = {}
    if config.warmstart.steps > 0:
      warm_tasks, fit_warm = warm_start_tasks(config, tokenizer, model.cfg.max_seq_len,
                                              train_tasks)
      params = warm_start(config, graphdef, params, warm_tasks, tokenizer, mesh, metrics)
    if drop:
      metrics.write(0, {**fit_train, **fit_eval, **fit_test, **fit_warm})
    state = grpo.init_state(policy(params), optimizer, mesh)
    ref_params = jax.tree.map(lambda x: x.copy(), params) if keeps_reference else {}
    if config.warmstart.steps > 0:
      # The warm-started policy, kept for evaluation and controls (rlcode eval
      # --checkpoint WORKDIR/warm_start); the run's own checkpoints rotate.
      save_checkpoint(os.path.join(config.workdir, WARM_START), 0, state, ref_params,
                      {"data_position": 0, "seed": config.seed, "step": 0})
  else:
    config_lib.check_resume(config, config.workdir)
    restored, meta, start_step = ckpt.restore(
        checkpoint.bundle_like(grpo.init_state(policy(params), optimizer, mesh), keeps_reference))
    state, ref_params, position = restored["state"], restored["ref"], meta["data_position"]
    metrics = MetricsWriter(config.workdir, resume_step=start_step)

  # ══════════════════════════════════════════════════════════════ 4. sampler and update
  stream = rollout.TaskStream(train_tasks, rl.prompts_per_step, config.seed, position)
  # rl.shared_prefix: each group's prompt runs once in the update (rlcode.shared_prefix).
  if rl.shared_prefix:
    logprob_fn = shared_prefix.logprob_fn(rl.temperature)
    example = shared_prefix.GroupedBatch.abstract(rl.prompts_per_step, n_rows)
  else:
    logprob_fn, example = None, grpo.SequenceBatch.abstract(n_rows)
  update = grpo.make_update_step(graphdef, optimizer, loss_cfg, mesh, state, example,
                                 logprob_fn=logprob_fn)
  ref_logprobs = (grpo.make_logprob_fn(graphdef, mesh, rl.temperature, logprob_fn)
                  if keeps_reference else None)

  def run_eval(step, params, test=False):
    result = evaluate.held_out_eval(config, policy(params), tokenizer, eval_tasks, mesh)
    row = {f"eval/{k}": v for k, v in result.items()}
    if test and test_tasks:
      result = evaluate.held_out_eval(config, policy(params), tokenizer, test_tasks, mesh)
      row.update({f"test/{k}": v for k, v in result.items()})
    rows.append(metrics.write(step, row))

  # ══════════════════════════════════════════════════════════════ 5. loop
  if start_step == 0 and config.train.eval_every:
    run_eval(0, state.params, test=True)
  bar = tqdm(range(start_step, config.train.steps), initial=start_step,
             total=config.train.steps, desc="grpo", disable=not config.train.progress_bar)
  for step in bar:
    tasks = stream.next()
    ro = rollout.sample(policy(state.params), tokenizer, tasks, group_size=rl.group_size,
                        max_new_tokens=rl.max_new_tokens, temperature=rl.temperature,
                        seed=config.seed * 1_000_003 + step, mesh=mesh)
    start = time.perf_counter()
    reward = rollout.score(ro, dict(config.rewards), rewards.options(config.reward_options))
    reward_s = time.perf_counter() - start
    adv = grpo.group_advantages(reward.scores, rl.group_size, rl.advantage)
    if rl.shared_prefix:
      batch = shared_prefix.rl_batch(ro, adv, tokenizer.pad_id, rl.max_new_tokens, multiple)
    else:
      batch = rollout.rl_batch(ro, adv, tokenizer.pad_id, rl.max_new_tokens, multiple)
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
        trained_len=float(ro.loss_lengths.mean()),
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
      run_eval(done, state.params, test=done == config.train.steps)
    if done % config.train.checkpoint_every == 0 or done == config.train.steps:
      ckpt.save(done, {"state": state, "ref": ref_params},
                {"data_position": stream.position, "seed": config.seed, "step": done})

  # ══════════════════════════════════════════════════════════════ 6. save
  ckpt.wait()
  ckpt.close()
  metrics.close()
  return rows


WARM_START = "warm_start"


def save_checkpoint(directory: str, step: int, state, ref_params, meta: dict) -> None:
  """One checkpoint in its own directory, written before returning."""
  ckpt = checkpoint.Checkpointer(directory, keep=1)
  ckpt.save(step, {"state": state, "ref": ref_params}, meta)
  ckpt.wait()
  ckpt.close()


def warm_start_tasks(config, tokenizer, max_seq_len: int, train_tasks):
  """The warm start's tasks: the training tasks, and the train split of
  `warmstart.data` (a data section like config.data) when the config has one, fitted
  to the context as the training tasks are (dropped and counted, "data/warmstart_*").

  Returns (tasks, counts).
  """
  extra_cfg = config.warmstart.get("data")
  if not extra_cfg:
    return list(train_tasks), {}
  extra, counts = rollout.fit_tasks(
      sources.load(extra_cfg, extra_cfg.train_split), tokenizer, split="warmstart",
      max_seq_len=max_seq_len, max_new_tokens=config.rl.max_new_tokens, drop_too_long=True)
  return list(train_tasks) + extra, counts


def warm_start(config, graphdef, params, tasks, tokenizer, mesh, metrics):
  """Supervised steps on reference solutions; returns the params (logs one step-0 row).

  Batches are padded to multiples of `rl.length_multiple` (default 32), as the GRPO
  updates are. With `warmstart.cache_dir` set, the result is kept there under a hash
  of everything it depends on (`warm_start_key`) and a later run with the same key
  loads it instead of training again: several runs (arms of an experiment, a
  cross-entropy control) then start from the very same parameters.
  """
  ws = config.warmstart
  cache = (os.path.join(ws.cache_dir, warm_start_key(config))
           if ws.get("cache_dir") else "")
  if cache and checkpoint.Checkpointer(cache).latest_step() is not None:
    ckpt = checkpoint.Checkpointer(cache)
    params, row, _ = ckpt.restore(checkpoint.abstract_like(params))
    ckpt.close()
    metrics.write(0, row)
    return params
  params, stats = sft.run(graphdef, params, tasks, tokenizer, mesh,
                          optimizer=grpo.OptimizerConfig.from_config(ws.optimizer),
                          batch_size=ws.batch_size, seed=config.seed + 1, steps=ws.steps,
                          multiple=int(config.rl.get("length_multiple", rollout.LENGTH_MULTIPLE)),
                          progress=config.train.progress_bar, desc="warm start")
  row = {"sft_loss_first": stats["loss_first"], "sft_loss_last": stats["loss_last"],
         "sft_steps": ws.steps}
  metrics.write(0, row)
  if cache:
    ckpt = checkpoint.Checkpointer(cache)
    ckpt.save(ws.steps, params, row)
    ckpt.wait()
    ckpt.close()
  return params


def warm_start_key(config) -> str:
  """A hash of what the warm start's parameters depend on: the seed, model, data,
  warm-start settings (its cache_dir aside), the batch length multiple and the
  rollout budget (which decides the training tasks that fit)."""
  ws = {k: v for k, v in config.warmstart.to_dict().items() if k != "cache_dir"}
  parts = {"seed": config.seed, "model": config.model.to_dict(), "data": config.data.to_dict(),
           "warmstart": ws, "length_multiple": config.rl.get("length_multiple"),
           # Tasks whose prompt leaves no room for the rollouts are dropped before it.
           "max_new_tokens": config.rl.max_new_tokens}
  # The data section's splits and evaluation size do not change the training tasks.
  for key in ("eval_split", "test_split", "max_eval_tasks", "data_dir"):
    parts["data"].pop(key, None)
  if ws.get("data"):
    ws["data"].pop("data_dir", None)  # where its datasets are cached, not what they hold
  text = json.dumps(parts, sort_keys=True, default=list)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def _batch_tokens(batch) -> int:
  """Token positions the update computes (each group's prompt once when shared)."""
  if isinstance(batch, shared_prefix.GroupedBatch):
    return batch.prompt_tokens.size + batch.completion_tokens.size
  return batch.tokens.size


def _passed(detail: dict) -> bool:
  tests = detail.get("tests")
  return bool(tests and tests.get("status") == "passed")
