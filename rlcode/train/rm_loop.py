"""Training a reward model on choices, top to bottom.

    rlcode train --config configs/rm_choices.py          # config.trainer = "rm"

Sections: mesh -> data -> model and optimiser -> the run (fresh: the backbone from
config.rm.init_from; resumed: the latest checkpoint) -> update -> loop (batch, update,
log) with periodic evaluation on config.data.eval_split and checkpoints. The loss is the
1-of-k Plackett-Luce negative log-likelihood of each observed choice (rlcode.rm.loss).
Re-running the same command in the same workdir resumes from the latest checkpoint.

The backbone starts from scratch or, with config.rm.init_from (a policy's workdir or
checkpoint directory, e.g. WORKDIR/warm_start), from that policy's weights; the policy's
model must be the one config.model describes.
"""

from __future__ import annotations

import jax
from flax import nnx

from rlcode import optim
from rlcode.config import loader, record
from rlcode.data.stream import TaskStream
from rlcode.errors import BadInput
from rlcode.models.tokenizer import load_tokenizer
from rlcode.parallel import sharding
from rlcode.rm import build, steps
from rlcode.rm.batch import ChoiceBatch, choice_batch
from rlcode.runs import checkpoint
from rlcode.policy import policy_eval
from rlcode.train import scaffold


def train(config) -> list[dict]:
  """Runs config.train.steps updates; returns the rows written to metrics.jsonl."""
  config = loader.resolve(config)
  rm = config.rm

  # ══════════════════════════════════════════════════════════════ 1. mesh
  mesh = sharding.mesh_from_config(config.mesh)
  dp = sharding.batch_shards(mesh)
  if rm.batch_choices % dp:
    raise BadInput(f"config.rm.batch_choices={rm.batch_choices} does not split over the "
                   f"{dp} data-parallel devices of the mesh")

  # ══════════════════════════════════════════════════════════════ 2. data
  splits = build.load_choice_splits(config.data)
  k = max(c.k for c in splits["train"] + splits["eval"])
  if rm.max_candidates is not None and k > rm.max_candidates:
    raise BadInput(f"a choice has {k} candidates, more than config.rm.max_candidates="
                   f"{rm.max_candidates}")
  k = rm.max_candidates or k
  features = tuple(rm.features)
  for c in splits["train"][:1] + splits["eval"][:1]:
    c.features(features)  # a missing feature is an error before any training

  # ══════════════════════════════════════════════════════════════ 3. model and optimiser
  tokenizer = load_tokenizer(config.model.tokenizer or "bytes")
  policy_config = (record.recorded_config(rm.init_from, "config.rm.init_from")
                   if rm.init_from else None)
  model = build.build_reward_model(config.model, config.rm, mesh, config.seed)
  max_len = model.backbone.cfg.max_seq_len
  graphdef, _ = nnx.split(model, nnx.Param)
  optimizer = optim.make_optimizer(optim.OptimizerConfig.from_config(config.optimizer))

  with scaffold.Run(config, desc="rm") as run:
    # ════════════════════════════════════════════════════════════ 4. fresh or resumed
    position = 0
    if run.fresh:
      if rm.init_from:
        recipe = policy_eval.Recipe.of(policy_config.model, policy_config.optimizer,
                                       policy_config.rl, policy_config.seed)
        build.load_backbone(model, rm.init_from, recipe, mesh)
      state = optim.init_state(model, optimizer, mesh)
    else:
      restored, meta = run.restore(
          {"state": checkpoint.abstract_like(optim.init_state(model, optimizer, mesh))})
      state, position = restored["state"], meta["data_position"]

    # ════════════════════════════════════════════════════════════ 5. update
    example = ChoiceBatch.abstract(rm.batch_choices, k, len(features))
    update = steps.make_update_step(graphdef, optimizer, mesh, state, example)
    score_step = steps.make_score_step(graphdef, mesh, example)
    stream = TaskStream(splits["train"], rm.batch_choices, config.seed, position)
    batch_kw = dict(rows=rm.batch_choices, k=k, max_len=max_len, features=features)

    def run_eval(step):
      result = steps.evaluate_choices(score_step, state.params, tokenizer, splits["eval"],
                                      **batch_kw)
      run.log(step, {f"eval/{name}": v for name, v in result.items()}
              | {"choices_seen": step * rm.batch_choices})

    # ════════════════════════════════════════════════════════════ 6. loop
    if run.eval_at_start():
      run_eval(0)
    for step in run.steps():
      batch, cut = choice_batch(tokenizer, stream.next(), **batch_kw)
      state, m = update(state, batch)
      m = jax.device_get(m)
      done = step + 1
      row = {name: float(v) for name, v in m.items()}
      row.update(rows_cut=cut, choices_seen=done * rm.batch_choices)
      run.log(done, row)
      run.postfix(loss=row["loss"], acc=row["accuracy"])
      if run.eval_due(done):
        run_eval(done)
      if run.save_due(done):
        run.save(done, {"state": state},
                 {"data_position": stream.position, "seed": config.seed, "step": done})
  return run.rows
