"""GRPO whose rollouts are an outside harness's episodes, top to bottom.

    rlcode train --config configs/harness_tiny.py        # config.trainer = "harness"

Sections: the harness (its import paths resolved first) -> mesh -> data -> model and
optimiser -> the run (fresh, or the latest checkpoint) -> update -> the server -> loop
(episodes, update, publish, log) with checkpoints. The policy is served in this process
(rlcode.serve.local.LocalServer: the real app under uvicorn on 127.0.0.1, a random API
key); each step the harness (config.harness.harness) plays rl.group_size episodes of each
of the stream's rl.prompts_per_step tasks against it (rlcode.harness.rollouts: its calls
recorded token-exactly, groups with a failed episode dropped and counted), the kept groups'
segments are one shared-prompt batch (each group's prompt once), rl.num_passes updates
run on it, and the new weights are published to the server as the next policy version,
which the next step's calls sample with. A step whose groups were all dropped makes no
update (logged as a warning and as update_skipped = 1); a step where every episode failed
stops the run with one line naming the causes and the first error. The rows carry the
rollout metrics (episodes, failures by cause, dropped groups, segments, splits, calls,
rewards, trained tokens), the update's (loss, clip_frac, ...) and policy_version, the
version that sampled the step. Re-running the command in the same workdir resumes from
the latest checkpoint: the state, the task stream's position and the policy version.

With harness.verifiers the harness is a `verifiers` environment (rlcode.harness.verifiers_env):
its dataset's rows are the tasks (data.source "verifiers"), its own rollouts the episodes,
sampled at rl.temperature, and its rubric's score their reward. With harness.openenv the
harness plays an OpenEnv environment of config.data's code tasks (rlcode.harness.openenv_env):
openenv's server is started on 127.0.0.1 for the run beside the policy's and stopped with
it; an episode's actions are completions at rl.temperature, its return the reward. With
harness.mini_swe_agent the harness is mini-swe-agent (rlcode.harness.mini_swe) on config.data's
executable PR tasks (data.source "swe"), its commands run in rlcode's sandbox, the task's
tests on the workspace it leaves the reward.

A trainer of its own, not a mode of the grpo trainer's rl.rollouts: the grpo loop's
rollouts are its own sampler's (rlcode.rl.async_rollouts, partial rollouts, several
processes, the rewards registry's scoring, DAPO's shaping and rounds, stale-row
corrections, distillation), each a setting of the rl section this loop could not honour:
an outside harness samples, scores and paces its own episodes, and its rows are segments
of varying number and length. As the agent trainer does, this one takes the shared-prefix
update, the optimiser state, the run scaffold and the checkpoints from where they live
(rlcode.rl.shared_prefix, rlcode.policy.training, rlcode.runs) and reads only the rl keys
that mean the same here (group_size, prompts_per_step, the advantage and the objective);
`only=` keeps the others at their defaults.

The harness samples with the policy's current weights (the loop is synchronous: a step's
calls all sample one version), at rl.temperature. There is no periodic evaluation (the
harness is the environment): train.eval_every and train.eval_steps stay unset.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import secrets
import time

import numpy as np

from rlcode import optim
from rlcode.config import loader, serving
from rlcode.data import sources
from rlcode.data.stream import TaskStream
from rlcode.errors import BadInput
from rlcode.harness import rollouts
from rlcode.models.build import build_model
from rlcode.parallel import sharding
from rlcode.policy.training import PolicyTraining
from rlcode.rl import algorithm, async_rollouts, grpo, shared_prefix
from rlcode.train import scaffold
from rlcode.serve import server as server_lib
from rlcode.serve.local import LocalServer

log = logging.getLogger(__name__)
# The serve section's keys the in-process server takes (its log and watcher are
# `rlcode serve`'s; the model's name is the server's own argument).
_SERVE_KEYS = tuple(f for f in serving.Serve.__dataclass_fields__
                    if f not in ("log_url", "watch_seconds", "model_name"))


def load_callable(path: str, what: str):
  """The callable an import path "package.module:attr.attr" names; BadInput naming `what`
  and what is wrong when it does not import, has no such attribute or is not callable."""
  module_name, _, attrs = path.partition(":")
  try:
    obj = importlib.import_module(module_name)
  except ImportError as e:
    raise BadInput(f"config.{what}={path!r}: cannot import {module_name!r} ({e})") from None
  for i, attr in enumerate(attrs.split(".")):
    if not hasattr(obj, attr):
      where = ".".join([module_name] + attrs.split(".")[:i])
      raise BadInput(f"config.{what}={path!r}: {where} has no attribute {attr!r}")
    obj = getattr(obj, attr)
  if not callable(obj):
    raise BadInput(f"config.{what}={path!r}: not a callable (an object of type "
                   f"{type(obj).__name__})")
  return obj


def train(config) -> list[dict]:
  """Runs config.train.steps GRPO steps on harness episodes; returns the rows written."""
  config = loader.resolve(config)
  rl, hc = config.rl, config.harness

  # ══════════════════════════════════════════════════════════════ 0. the harness
  name = config.serve.model_name or "rlcode"
  env = None
  if hc.verifiers is not None:
    from rlcode.harness import verifiers_env  # deferred: verifiers and its stack
    env = verifiers_env.load(hc.verifiers)
    harness = verifiers_env.Harness(env, model=name, temperature=rl.temperature,
                                    max_tokens=hc.verifiers.max_tokens,
                                    timeout=hc.timeout_seconds or 600.0)
  elif hc.openenv is not None:
    from rlcode.harness import openenv_env  # deferred: openenv and its stack
    harness = None  # played against the environment's server, started with the policy's
  elif hc.mini_swe_agent is not None:
    from rlcode.harness import mini_swe  # deferred: mini-swe-agent and litellm
    ms = hc.mini_swe_agent
    harness = mini_swe.Harness(model=name, config=ms.config, temperature=rl.temperature,
                               max_tokens=ms.max_tokens, step_limit=ms.step_limit,
                               command_seconds=ms.command_seconds)
  else:
    harness = load_callable(hc.harness, "harness.harness")
  if (env is not None) != (config.data.source == "verifiers"):
    raise BadInput(f"config.data.source={config.data.source!r}: 'verifiers' (the tasks are "
                   "the environment's rows) goes with harness.verifiers, and only with it")
  reward = load_callable(hc.reward, "harness.reward") if hc.reward else None
  if config.train.eval_every or config.train.eval_steps:
    raise BadInput("config.train.eval_every/eval_steps: the harness trainer does not "
                   "evaluate during training (the harness is its environment); leave them "
                   "unset")
  if rl.micro_batch_rows is not None:
    raise BadInput(f"config.rl.micro_batch_rows={rl.micro_batch_rows}: a harness batch's "
                   "rows are its episodes' segments, not groups of rl.group_size rows; "
                   "leave it unset")

  # ══════════════════════════════════════════════════════════════ 1. mesh
  mesh = sharding.mesh_from_config(config.mesh)
  dp = sharding.batch_shards(mesh)

  # ══════════════════════════════════════════════════════════════ 2. data
  train_tasks = (verifiers_env.tasks(env, config.data.train_split) if env is not None
                 else sources.load(config.data, config.data.train_split))
  untested = [t.id for t in train_tasks if not t.tests]
  if hc.openenv is not None and untested:
    raise BadInput(f"config.data.source={config.data.source!r}: harness.openenv's environment "
                   f"scores a task by its tests; task {untested[0]!r} has none")
  if hc.mini_swe_agent is not None and config.data.source != "swe":
    raise BadInput(f"config.data.source={config.data.source!r}: harness.mini_swe_agent works "
                   "on executable PR tasks (data.source 'swe')")

  # ══════════════════════════════════════════════════════════════ 3. model, optimiser
  model, tokenizer = build_model(config.model, mesh, config.seed)
  max_len = model.cfg.max_seq_len
  loss_cfg = algorithm.loss(rl, max_len)
  trained = PolicyTraining(model, config.optimizer, mesh, keeps_reference=loss_cfg.uses_reference,
                           base_reloads=bool(config.model.hf_path))
  graphdef = trained.graphdef
  advantage_of = algorithm.advantages(rl)
  template = server_lib.template_for(config.serve, config.model)

  with scaffold.Run(config, desc="harness grpo") as run:
    # ════════════════════════════════════════════════════════════ 4. fresh or resumed
    if run.fresh:
      (state, ref_params), position, version = trained.fresh(trained.params), 0, 0
    else:
      restored, meta = run.restore(trained.abstract_bundle())
      (state, ref_params) = trained.from_bundle(restored)
      position, version = meta["data_position"], meta["policy_version"]

    # ════════════════════════════════════════════════════════════ 5. update
    stream = TaskStream(train_tasks, rl.prompts_per_step, config.seed, position)
    example = shared_prefix.GroupedBatch.abstract(rl.prompts_per_step,
                                                  rl.prompts_per_step * rl.group_size)
    update = shared_prefix.update_step(graphdef, trained.optimizer, loss_cfg, mesh, state,
                                       example, trainable=trained.trainable,
                                       dropout_seed=config.seed, offload=trained.offload)
    ref_logprobs = (grpo.make_logprob_fn(graphdef, mesh, rl.temperature,
                                         shared_prefix.logprob_fn(rl.temperature))
                    if loss_cfg.uses_reference else None)
    # The server's weights are a copy: the update donates the state's arrays.
    sync = async_rollouts.WeightSync(mesh, mesh, state.params)

    # ════════════════════════════════════════════════════════════ 6. the server(s)
    # An OpenEnv session an episode: those a step plays, and as many given up by the timeout.
    envs = (openenv_env.EnvServer(train_tasks, hc.openenv.max_turns,
                                  sessions=hc.workers + rl.group_size * rl.prompts_per_step)
            if hc.openenv is not None else contextlib.nullcontext())
    with envs, LocalServer(trained.model(sync(state.params)[0]), tokenizer, template=template,
                           api_key=secrets.token_urlsafe(24), name=name,
                           serve={k: config.serve[k] for k in _SERVE_KEYS},
                           version=version) as server:
      if hc.openenv is not None:
        harness = openenv_env.Harness(envs.url, model=name, temperature=rl.temperature,
                                      max_tokens=hc.openenv.max_tokens,
                                      timeout=hc.timeout_seconds or 600.0)
      # ══════════════════════════════════════════════════════════ 7. loop
      for step in run.steps():
        step_start = time.perf_counter()
        try:
          ro = rollouts.rollout(harness, stream.next(), rl.group_size, server, reward=reward,
                                advantage=advantage_of, pad_id=tokenizer.pad_id,
                                max_len=max_len, workers=hc.workers,
                                timeout=hc.timeout_seconds, step=step)
        except rollouts.AllFailed as e:
          played = (f"harness.harness={hc.harness!r}" if hc.harness is not None else
                    next(f"harness.{k}" for k in ("verifiers", "openenv", "mini_swe_agent")
                         if getattr(hc, k) is not None))
          raise BadInput(f"step {step}: {e} (config.{played})") from None
        if hc.save_episodes and run.main:
          rollouts.write_episodes(os.path.join(run.workdir, "episodes",
                                               f"step_{step + 1:06d}.jsonl"), ro.episodes)
        row = {"policy_version": float(version), **ro.metrics}
        if ro.batch is None:
          log.warning("step %d: every group had a failed episode (%d of %d episodes "
                      "failed); no update this step", step, int(ro.metrics["failed_episodes"]),
                      int(ro.metrics["episodes"]))
          row["update_skipped"] = 1.0
        else:
          batch = _pad_groups(ro.batch, dp)
          if ref_logprobs is not None:
            batch.ref_logp = np.asarray(ref_logprobs(
                trained.reference_params(ref_params, state), batch))
          state, m, update_s = optim.run_passes(update, state, batch, rl.num_passes,
                                                step=step,
                                                on_nonfinite=config.train.on_nonfinite)
          row.update({k: float(v) for k, v in m.items()}, update_skipped=0.0,
                     update_seconds=update_s, stale_tokens=_stale(ro, version))
          if not m["skipped"]:
            start = time.perf_counter()
            weights, _ = sync(state.params)
            version += 1
            server.publish(trained.model(weights), version)
            row["publish_seconds"] = time.perf_counter() - start
        row["step_seconds"] = time.perf_counter() - step_start
        run.log(step + 1, row)
        run.postfix(reward=row.get("reward_mean", 0.0), loss=row.get("loss", 0.0))

        done = step + 1
        if run.save_due(done):
          run.save(done, trained.bundle(state, ref_params),
                   {"data_position": stream.position, "seed": config.seed, "step": done,
                    "policy_version": version})
  return run.rows


def _stale(ro: rollouts.Rollout, version: int) -> float:
  """Trained tokens sampled by another version than `version` (0 in this synchronous loop,
  unless a call outlived its step)."""
  return float(sum(v != version for i, s in filter(None, ro.rows)
                   for v, k in zip(ro.episodes[i].segments[s].versions,
                                   ro.episodes[i].segments[s].mask) if k))


def _pad_groups(batch: shared_prefix.GroupedBatch, multiple: int) -> shared_prefix.GroupedBatch:
  """The batch with empty groups (a one-token prompt, rows out of the loss) up to a
  multiple of `multiple` groups, the mesh's batch shards."""
  p = len(batch.prompt_lengths)
  extra = -p % multiple
  if not extra:
    return batch
  rows = len(batch.adv) // p
  pad = lambda x, n, value=0: np.concatenate(
      [np.asarray(x), np.full((n,) + np.shape(x)[1:], value, np.asarray(x).dtype)])
  return shared_prefix.GroupedBatch(
      prompt_tokens=pad(batch.prompt_tokens, extra), prompt_lengths=pad(batch.prompt_lengths,
                                                                          extra, 1),
      completion_tokens=pad(batch.completion_tokens, extra * rows),
      mask=pad(batch.mask, extra * rows), old_logp=pad(batch.old_logp, extra * rows),
      ref_logp=pad(batch.ref_logp, extra * rows), adv=pad(batch.adv, extra * rows),
      weight=pad(batch.weight, extra * rows, 1))
