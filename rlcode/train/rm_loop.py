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

import os
import jax
from flax import nnx
from tqdm import tqdm
from rlcode.runs import checkpoint
from rlcode.config import loader
from rlcode.parallel import sharding
from rlcode import optim
from rlcode.errors import BadInput
from rlcode.runs.metrics import MetricsWriter
from rlcode.models.tokenizer import load_tokenizer
from rlcode.rm.batch import ChoiceBatch, choice_batch
from rlcode.data.stream import TaskStream
from rlcode.config import record
from rlcode.rm import build
from rlcode.rm import steps


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
  splits = build.load_choice_splits(config.data)
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
  policy_config = record.recorded_config(rm.init_from, "config.rm.init_from") if rm.init_from else None
  model = build.build_reward_model(config, mesh)
  max_len = model.backbone.cfg.max_seq_len
  graphdef, params = nnx.split(model, nnx.Param)
  optimizer = optim.make_optimizer(optim.OptimizerConfig.from_config(config.optimizer))
  ckpt = checkpoint.Checkpointer(os.path.join(config.workdir, "checkpoints"),
                                 keep=tr.keep_checkpoints)
  start_step, position = 0, 0
  if ckpt.latest_step() is None:
    metrics = MetricsWriter(config.workdir)
    loader.write_run_config(config, config.workdir)
    if rm.init_from:
      build.load_backbone(model, rm.init_from, policy_config, mesh)
    state = optim.init_state(model, optimizer, mesh)
  else:
    loader.check_resume(config, config.workdir)
    restored, meta, start_step = ckpt.restore(
        {"state": checkpoint.abstract_like(optim.init_state(model, optimizer, mesh))})
    state, position = restored["state"], meta["data_position"]
    metrics = MetricsWriter(config.workdir, resume_step=start_step)

  # ══════════════════════════════════════════════════════════════ 4. update
  example = ChoiceBatch.abstract(rm.batch_choices, k, len(features))
  update = steps.make_update_step(graphdef, optimizer, mesh, state, example)
  score_step = steps.make_score_step(graphdef, mesh, example)
  stream = TaskStream(splits["train"], rm.batch_choices, config.seed, position)
  batch_kw = dict(rows=rm.batch_choices, k=k, max_len=max_len, features=features)

  def run_eval(step):
    result = steps.evaluate_choices(score_step, state.params, tokenizer, splits["eval"], **batch_kw)
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
