"""Supervised warm start: cross-entropy on reference solutions, one jitted step.

Models trained from scratch cannot sample a single passing program, so GRPO's
group-relative advantages would all be zero; a short supervised phase on the
training split's reference solutions gives RL something to sharpen.
"""

from __future__ import annotations

import jax
import optax
from flax import nnx
from jax.sharding import Mesh

from rlcode import grpo, sharding


def make_sft_step(graphdef, optimizer: optax.GradientTransformation, mesh: Mesh,
                  state: grpo.TrainState, example_batch: grpo.SequenceBatch):
  """(state, batch) -> (state, {"sft_loss", "grad_norm"}): the mean negative log-likelihood
  of the masked window targets (the reference tokens), logits computed there only."""

  def loss_fn(params, batch):
    with sharding.activate(mesh):
      logp, _ = grpo.sequence_logprobs(nnx.merge(graphdef, params), batch, 1.0)
    return -grpo.masked_mean(logp, batch.mask)

  def step(state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    return (grpo.TrainState(optax.apply_updates(state.params, updates), opt_state,
                            state.step + 1),
            {"sft_loss": loss, "grad_norm": optax.tree.norm(grads)})

  state_sh = grpo.state_shardings(state, mesh)
  return jax.jit(step, in_shardings=(state_sh, grpo.batch_shardings(mesh, example_batch)),
                 out_shardings=(state_sh, None), donate_argnums=(0,))
