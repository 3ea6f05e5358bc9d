"""The reward model's jitted programs: scores of choice batches, the update, evaluation.

The update minimises the 1-of-k Plackett-Luce negative log-likelihood of each observed
choice (rlcode.rm.loss) through rlcode.optim.finite_step; `evaluate_choices` reports mean
loss and choice accuracy over a split.
"""

from __future__ import annotations

import functools
import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh
from rlcode.parallel import sharding
from rlcode import optim
from rlcode.rm import loss as rm_loss
from rlcode.rm.batch import ChoiceBatch, choice_batch
from rlcode.rm.model import RewardModel


def score_choices(model: RewardModel, batch: ChoiceBatch) -> jax.Array:
  """Scores [B, K] of every candidate slot of the batch."""
  b, k, length = batch.tokens.shape
  feats = batch.features.reshape(b * k, -1) if model.head.features else None
  return model(batch.tokens.reshape(b * k, length), batch.start.reshape(-1),
               batch.length.reshape(-1), feats).reshape(b, k)


def make_update_step(graphdef, optimizer: optax.GradientTransformation, mesh: Mesh,
                     state: optim.TrainState, example: ChoiceBatch):
  """(state, batch) -> (state, {"loss", "accuracy", "grad_norm", "skipped"}), one jit.

  A non-finite loss or gradient leaves the state unchanged (skipped = 1)."""

  def loss_fn(params, batch):
    with sharding.activate(mesh):
      scores = score_choices(nnx.merge(graphdef, params), batch)
    loss = rm_loss.plackett_luce_loss(scores, batch.chosen, batch.valid, batch.weight)
    return loss, {"loss": loss, "accuracy": rm_loss.choice_accuracy(
        scores, batch.chosen, batch.valid, batch.weight)}

  step = functools.partial(optim.finite_step, loss_fn, optimizer)

  state_sh = optim.state_shardings(state, mesh)
  return jax.jit(step, in_shardings=(state_sh, optim.batch_shardings(mesh, example)),
                 out_shardings=(state_sh, None), donate_argnums=(0,))


def make_score_step(graphdef, mesh: Mesh, example: ChoiceBatch):
  """(params, batch) -> scores [B, K], jitted, the batch sharded over its rows."""

  def run(params, batch):
    with sharding.activate(mesh):
      return score_choices(nnx.merge(graphdef, params), batch)
  return jax.jit(run, in_shardings=(None, optim.batch_shardings(mesh, example)))


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
