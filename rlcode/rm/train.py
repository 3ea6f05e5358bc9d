"""Training a reward model on choices, top to bottom.

    rlcode train-rm --config configs/rm_choices.py

Sections: mesh -> data -> model, optimiser and checkpoint -> update -> loop (batch,
update, log) with periodic evaluation on config.data.eval_split -> save. The loss is the
1-of-k Plackett-Luce negative log-likelihood of each observed choice (rlcode.rm.loss).
Re-running the same command in the same workdir resumes from the latest checkpoint.

The backbone starts from scratch or, with config.rm.init_from (a policy's workdir or
checkpoint directory, e.g. WORKDIR/warm_start), from that policy's weights; the policy's
model must be the one config.model describes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh
from tqdm import tqdm

from rlcode import checkpoint, config_lib, grpo, sharding
from rlcode.data import sources
from rlcode.data.choices import Choice, ChoicesBuilder, load_choices
from rlcode.errors import BadInput, MissingInput
from rlcode.metrics import MetricsWriter
from rlcode.models.build import model_config
from rlcode.models.tokenizer import load_tokenizer
from rlcode.rm import loss as rm_loss
from rlcode.rm.batch import ChoiceBatch, choice_batch
from rlcode.rm.model import HeadConfig, RewardModel
from rlcode.rollout import TaskStream


def head_config(rm_cfg) -> HeadConfig:
  return HeadConfig(pooling=rm_cfg.pooling, hidden=rm_cfg.head_hidden,
                    features=tuple(rm_cfg.features))


def build_reward_model(config, mesh: Mesh) -> RewardModel:
  """config.model's decoder with config.rm's head, parameters created in their shards."""
  if config.model.get("hf_path"):
    raise BadInput("config.model.hf_path: reward models build config.model.arch (start "
                   "them from a policy with config.rm.init_from)")
  cfg, head = model_config(config.model), head_config(config.rm)
  return sharding.init_sharded(lambda: RewardModel(cfg, head, rngs=nnx.Rngs(config.seed)), mesh)


def load_choice_splits(data_cfg) -> dict[str, list[Choice]]:
  """{"train": ..., "eval": ...} of config.data (the train split cut to max_train_choices
  by a seeded permutation when that is set)."""
  path = sources.resolve(data_cfg.path)
  if not os.path.isfile(path):
    raise MissingInput(f"config.data.path={data_cfg.path!r}: no such choices file")
  import tensorflow_datasets as tfds
  tfds.disable_progress_bar()
  builder = ChoicesBuilder(data_dir=sources.data_dir(data_cfg), path=path,
                           held_out_fraction=data_cfg.held_out_fraction)
  train = load_choices(builder, data_cfg.train_split)
  if data_cfg.max_train_choices:
    keep = np.random.default_rng(data_cfg.subset_seed).permutation(len(train))
    train = [train[i] for i in sorted(keep[:data_cfg.max_train_choices])]
  return {"train": train, "eval": load_choices(builder, data_cfg.eval_split)}


def score_choices(model: RewardModel, batch: ChoiceBatch) -> jax.Array:
  """Scores [B, K] of every candidate slot of the batch."""
  b, k, length = batch.tokens.shape
  feats = batch.features.reshape(b * k, -1) if model.head.features else None
  return model(batch.tokens.reshape(b * k, length), batch.start.reshape(-1),
               batch.length.reshape(-1), feats).reshape(b, k)


def make_update_step(graphdef, optimizer: optax.GradientTransformation, mesh: Mesh,
                     state: grpo.TrainState, example: ChoiceBatch):
  """(state, batch) -> (state, {"loss", "accuracy", "grad_norm", "skipped"}), one jit.

  A non-finite loss or gradient leaves the state unchanged (skipped = 1)."""

  def loss_fn(params, batch):
    with sharding.activate(mesh):
      scores = score_choices(nnx.merge(graphdef, params), batch)
    loss = rm_loss.plackett_luce_loss(scores, batch.chosen, batch.valid, batch.weight)
    return loss, {"loss": loss, "accuracy": rm_loss.choice_accuracy(
        scores, batch.chosen, batch.valid, batch.weight)}

  step = functools.partial(grpo.finite_step, loss_fn, optimizer)

  state_sh = grpo.state_shardings(state, mesh)
  return jax.jit(step, in_shardings=(state_sh, grpo.batch_shardings(mesh, example)),
                 out_shardings=(state_sh, None), donate_argnums=(0,))


def make_score_step(graphdef, mesh: Mesh, example: ChoiceBatch):
  """(params, batch) -> scores [B, K], jitted, the batch sharded over its rows."""

  def run(params, batch):
    with sharding.activate(mesh):
      return score_choices(nnx.merge(graphdef, params), batch)
  return jax.jit(run, in_shardings=(None, grpo.batch_shardings(mesh, example)))


def evaluate_choices(score_step, params, tokenizer, choices, *, rows: int, k: int,
                     max_len: int, features) -> dict[str, float]:
  """Mean Plackett-Luce loss and choice accuracy over `choices`, batched by `rows`."""
  nll, hits = [], []
  for i in range(0, len(choices), rows):
    part = choices[i:i + rows]
    batch, _ = choice_batch(tokenizer, part, rows=rows, k=k, max_len=max_len, features=features)
    scores = score_step(params, batch)
    n = len(part)
    nll.append(np.asarray(rm_loss.choice_nll(scores, batch.chosen, batch.valid))[:n])
    masked = np.where(batch.valid > 0, np.asarray(scores), -np.inf)
    hits.append((masked.argmax(1) == batch.chosen)[:n])
  return {"loss": float(np.concatenate(nll).mean()),
          "accuracy": float(np.concatenate(hits).mean()), "choices": len(choices)}


def recorded_config(path: str, what: str = "path") -> ml_collections.ConfigDict:
  """The config a run was started with: config.json in `path` or the directory above it
  (a workdir's warm_start/ or checkpoints/)."""
  for where in (path, os.path.dirname(os.path.abspath(path))):
    candidate = os.path.join(where, config_lib.RUN_CONFIG)
    if os.path.isfile(candidate):
      with open(candidate) as f:
        return ml_collections.ConfigDict(json.load(f))
  raise MissingInput(f"{what}={path!r}: no {config_lib.RUN_CONFIG} there or one directory "
                     "up; name a run's workdir or checkpoint directory")


def load_backbone(model: RewardModel, path: str, policy_config, mesh: Mesh) -> None:
  """Copies the policy at `path`, trained with `policy_config`, into the reward model's
  decoder (same ModelConfig)."""
  from rlcode import evaluate
  policy, _, _, _ = evaluate.restore_policy(policy_config, path, mesh)
  if policy.cfg != model.backbone.cfg:
    differ = [f.name for f in dataclasses.fields(policy.cfg)
              if getattr(policy.cfg, f.name) != getattr(model.backbone.cfg, f.name)]
    raise BadInput(f"config.rm.init_from={path!r}: the policy's model differs from "
                   f"config.model in {differ}")
  nnx.update(model.backbone, nnx.state(policy, nnx.Param))


def train_rm(config) -> list[dict]:
  """Runs config.train.steps updates; returns the rows written to metrics.jsonl."""
  rows: list[dict] = []
  rm, tr = config.rm, config.train

  # ══════════════════════════════════════════════════════════════ 1. mesh
  mesh = sharding.mesh_from_config(config.mesh)
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  if rm.batch_choices % dp:
    raise BadInput(f"config.rm.batch_choices={rm.batch_choices} does not split over the "
                   f"{dp} data-parallel devices of the mesh")

  # ══════════════════════════════════════════════════════════════ 2. data
  splits = load_choice_splits(config.data)
  k = max(c.k for c in splits["train"] + splits["eval"])
  if rm.max_candidates and k > rm.max_candidates:
    raise BadInput(f"a choice has {k} candidates, more than config.rm.max_candidates="
                   f"{rm.max_candidates}")
  k = rm.max_candidates or k
  features = tuple(rm.features)
  for c in splits["train"][:1] + splits["eval"][:1]:
    c.features(features)  # a missing feature is an error before any training

  # ══════════════════════════════════════════════════════════════ 3. model, optimiser, checkpoint
  tokenizer = load_tokenizer(config.model.get("tokenizer") or "bytes")
  policy_config = recorded_config(rm.init_from, "config.rm.init_from") if rm.init_from else None
  model = build_reward_model(config, mesh)
  max_len = model.backbone.cfg.max_seq_len
  graphdef, params = nnx.split(model, nnx.Param)
  optimizer = grpo.make_optimizer(grpo.OptimizerConfig.from_config(config.optimizer))
  ckpt = checkpoint.Checkpointer(os.path.join(config.workdir, "checkpoints"),
                                 keep=tr.keep_checkpoints)
  start_step, position = 0, 0
  if ckpt.latest_step() is None:
    metrics = MetricsWriter(config.workdir)
    config_lib.write_run_config(config, config.workdir)
    if rm.init_from:
      load_backbone(model, rm.init_from, policy_config, mesh)
    state = grpo.init_state(model, optimizer, mesh)
  else:
    config_lib.check_resume(config, config.workdir)
    restored, meta, start_step = ckpt.restore(
        {"state": checkpoint.abstract_like(grpo.init_state(model, optimizer, mesh))})
    state, position = restored["state"], meta["data_position"]
    metrics = MetricsWriter(config.workdir, resume_step=start_step)

  # ══════════════════════════════════════════════════════════════ 4. update
  example = ChoiceBatch.abstract(rm.batch_choices, k, len(features))
  update = make_update_step(graphdef, optimizer, mesh, state, example)
  score_step = make_score_step(graphdef, mesh, example)
  stream = TaskStream(splits["train"], rm.batch_choices, config.seed, position)
  batch_kw = dict(rows=rm.batch_choices, k=k, max_len=max_len, features=features)

  def run_eval(step):
    result = evaluate_choices(score_step, state.params, tokenizer, splits["eval"], **batch_kw)
    rows.append(metrics.write(step, {f"eval/{name}": v for name, v in result.items()}
                              | {"choices_seen": step * rm.batch_choices}))

  eval_steps = set(tr.eval_steps)
  due = lambda done: ((tr.eval_every and (done % tr.eval_every == 0 or done == tr.steps))
                      or done in eval_steps)

  # ══════════════════════════════════════════════════════════════ 5. loop
  if start_step == 0 and (tr.eval_every or eval_steps):
    run_eval(0)
  bar = tqdm(range(start_step, tr.steps), initial=start_step, total=tr.steps, desc="rm",
             disable=not tr.progress_bar)
  for step in bar:
    batch, cut = choice_batch(tokenizer, stream.next(), **batch_kw)
    state, m = update(state, batch)
    m = jax.device_get(m)
    done = step + 1
    row = {name: float(v) for name, v in m.items()}
    row.update(rows_cut=cut, choices_seen=done * rm.batch_choices)
    rows.append(metrics.write(done, row))
    bar.set_postfix(loss=f"{row['loss']:.3f}", acc=f"{row['accuracy']:.2f}")
    if due(done):
      run_eval(done)
    if done % tr.checkpoint_every == 0 or done == tr.steps:
      ckpt.save(done, {"state": state}, {"data_position": stream.position, "seed": config.seed,
                                         "step": done})

  # ══════════════════════════════════════════════════════════════ 6. save
  ckpt.wait()
  ckpt.close()
  metrics.close()
  return rows
