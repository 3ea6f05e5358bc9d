"""The GRPO update step: one `jax.jit` of forward, backward, clipping and optimiser.

`make_update_step` takes the batch layout's log-prob function (the repeated layout,
rlcode.rl.sequences, by default; rlcode.rl.shared_prefix passes the shared-prompt one) and
returns (state, batch) -> (state, metrics) with explicit in/out shardings. A step whose
loss or gradient is not finite is skipped and counted. `make_logprob_fn` gives
reference log-probs; `make_proximal_fn` the decoupled-PPO correction of stale rows.

Stale samples (rlcode.rl.async_rollouts: drawn from a policy some versions behind the
trainer) are corrected by the decoupled PPO objective (Hilton et al. 2021, "Batch
size-invariance for policy optimization"; AReaL, Fu et al. 2025): the ratio is
clipped against the proximal policy (the trainer's at the start of the step) instead
of the behaviour policy, and each token is weighted by pi_prox / pi_behav truncated
at a cap. For an on-policy sample the proximal policy is the behaviour policy: its
log-probs are used as they are and the weight is exactly 1. This module must not know
where rewards come from.
"""

from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from rlcode.parallel import sharding
from rlcode import optim
from rlcode.rl import objective
from rlcode.rl import sequences


def make_update_step(graphdef, optimizer: optax.GradientTransformation, cfg: objective.LossConfig,
                     mesh: Mesh, state: optim.TrainState, example_batch: sequences.SequenceBatch,
                     logprob_fn=None):
  """The jitted update: (state, batch) -> (state, metrics).

  A non-finite loss or gradient leaves the state unchanged and reports
  metrics["skipped"] = 1; the caller decides whether to go on.

  logprob_fn(model, batch) -> (logp [N, L-1], entropy [N, L-1]) computes the
  policy's log-probabilities of the batch's targets; the default runs every row
  in full (sequence_logprobs). rlcode.shared_prefix passes one that runs each
  group's prompt once.
  """
  if logprob_fn is None:
    logprob_fn = lambda model, batch: sequences.sequence_logprobs(model, batch, cfg.temperature)

  def loss_fn(params, batch):
    with sharding.activate(mesh):
      model = nnx.merge(graphdef, params)
      logp, entropy = logprob_fn(model, batch)
    loss, metrics = objective.policy_loss(logp, batch.old_logp, batch.adv, batch.mask, cfg,
                                ref_logp_nt=batch.ref_logp if cfg.uses_reference else None,
                                weight_nt=batch.weight)
    metrics["entropy"] = objective.masked_mean(entropy, batch.mask)
    return loss, metrics

  step = functools.partial(optim.finite_step, loss_fn, optimizer)

  state_sh = optim.state_shardings(state, mesh)
  return jax.jit(step, in_shardings=(state_sh, optim.batch_shardings(mesh, example_batch)),
                 out_shardings=(state_sh, None), donate_argnums=(0,))


def _rows_sharding(mesh: Mesh, rows: int) -> NamedSharding:
  """The sharding of an [N, W] leaf of a batch of `rows` rows (as batch_shardings)."""
  return NamedSharding(mesh, sharding.logical_to_spec(("batch", None), (rows, 1), mesh=mesh,
                                                      what="batch"))


def make_logprob_fn(graphdef, mesh: Mesh, temperature: float, logprob_fn=None,
                    rows: int | None = None):
  """Jitted log-probabilities of a batch's targets under given params (for the reference).

  With `rows`, the result is laid out like the batch's [N, W] leaves, so it can take
  their place in a batch the update step reads.
  """
  if logprob_fn is None:
    logprob_fn = lambda model, batch: sequences.sequence_logprobs(model, batch, temperature)

  def run(params, batch):
    with sharding.activate(mesh):
      return logprob_fn(nnx.merge(graphdef, params), batch)[0]
  return jax.jit(run, out_shardings=None if rows is None else _rows_sharding(mesh, rows))


def make_proximal_fn(graphdef, mesh: Mesh, temperature: float, max_weight: float, rows: int,
                     logprob_fn=None):
  """The decoupled-PPO correction of a batch some of whose rows are stale.

  Returns jitted (params, batch, stale_n) -> (old_logp, weight, metrics): for rows
  with stale_n true, old_logp becomes the proximal log-probs (under `params`, the
  trainer's policy at the start of the step) and weight min(pi_prox / pi_behav,
  max_weight), from the behaviour log-probs the batch's old_logp holds; other rows
  keep their behaviour log-probs and weight 1. metrics: "iw_clip_frac", the
  fraction of the batch's trained tokens whose weight was truncated, and "iw_mean",
  their mean weight after truncation.
  """
  if not max_weight >= 1.0:
    raise ValueError(f"rl.max_importance_weight={max_weight} must be >= 1 (an on-policy "
                     "token's weight is 1)")
  if logprob_fn is None:
    logprob_fn = lambda model, batch: sequences.sequence_logprobs(model, batch, temperature)

  def run(params, batch, stale_n):
    with sharding.activate(mesh):
      prox, _ = logprob_fn(nnx.merge(graphdef, jax.lax.stop_gradient(params)), batch)
    valid = batch.mask > 0
    stale = stale_n[:, None] & valid
    # The log-ratio is selected before exp, as in policy_loss.
    raw = jnp.exp(jnp.where(stale, prox - batch.old_logp, 0.0))
    weight = jnp.where(stale, jnp.minimum(raw, max_weight), 1.0)
    old = jnp.where(stale_n[:, None], prox, batch.old_logp)
    mask = valid.astype(jnp.float32)
    metrics = {"iw_clip_frac": objective.masked_mean((raw > max_weight).astype(jnp.float32), mask),
               "iw_mean": objective.masked_mean(weight, mask)}
    return old, weight, metrics

  rows_sh = _rows_sharding(mesh, rows)
  return jax.jit(run, out_shardings=(rows_sh, rows_sh, None))
