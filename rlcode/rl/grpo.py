"""The GRPO update step: one `jax.jit` of forward, backward, clipping and optimiser.

`make_update_step` takes the batch layout's log-prob function (the repeated layout,
rlcode.rl.sequences, by default; rlcode.rl.shared_prefix passes the shared-prompt one) and
returns (state, batch) -> (state, metrics) with explicit in/out shardings. A step whose
loss or gradient is not finite is skipped and counted. `make_logprob_fn` gives
reference log-probs; `make_proximal_fn` the importance correction of recomputed rows
(rlcode.rl.correction): the decoupled-PPO correction of stale rows, or the rollout
correction of every row.

Stale samples (rlcode.rl.async_rollouts: drawn from a policy some versions behind the
trainer) are corrected by the decoupled PPO objective (Hilton et al. 2021, "Batch
size-invariance for policy optimization"; AReaL, Fu et al. 2025): the ratio is
clipped against the proximal policy (the trainer's at the start of the step) instead
of the behaviour policy, and each token is weighted by pi_prox / pi_behav truncated
at a cap. For an on-policy sample the proximal policy is the behaviour policy: its
log-probs are used as they are and the weight is exactly 1, unless rl.rollout_correction
recomputes every row (the sampler's numbers and the trainer's differ under the same
weights). This module must not know where rewards come from.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rlcode import optim
from rlcode.errors import BadInput
from rlcode.models import lora, moe
from rlcode.parallel import sharding
from rlcode.rl import correction as correction_lib
from rlcode.rl import objective, sequences


def make_update_step(graphdef, optimizer: optax.GradientTransformation, cfg: objective.LossConfig,
                     mesh: Mesh, state: optim.TrainState, example_batch: sequences.SequenceBatch,
                     logprob_fn=None, *, micro_batch_rows: int | None = None,
                     micro_batches=None,
                     trainable=nnx.Param, dropout_seed: int | None = None,
                     offload: bool = False):
  """The jitted update: (state, batch) -> (state, metrics).

  A non-finite loss or gradient leaves the state unchanged and reports
  metrics["skipped"] = 1; the caller decides whether to go on.

  logprob_fn(model, batch) -> (logp [N, L-1], entropy [N, L-1]) computes the
  policy's log-probabilities of the batch's targets; the default runs every row
  in full (sequence_logprobs). rlcode.shared_prefix passes one that runs each
  group's prompt once.

  micro_batch_rows: a batch of more rows is split into micro-batches of this many (the
  batch's `micro_batches`: whole groups each, so a group's prompt still runs once) and
  the gradient accumulated over them in one scan, each micro-batch's loss its share of
  the whole batch's (objective.Totals): the same loss, metrics and gradient as one pass,
  with one micro-batch's activations alive at a time. micro_batches(batch) -> m, in place
  of micro_batch_rows, chooses the count from the batch's shapes (packed batches: by
  tokens, rlcode.rl.packing.micro_count). trainable: the params the optimiser
  trains (LoRA: the adapters).
  dropout_seed: the adapters' dropout draws from this seed and the step. offload: the
  optimiser state lives in host memory (optim.init_state's `offload`).
  cfg.routing_replay: the forward replays the experts the batch recorded (MoE routing
  replay; `with_routing`), else it routes. The log-prob functions replay whatever
  record a batch carries: make_logprob_fn and make_proximal_fn replay it when given one.
  """
  if logprob_fn is None:
    logprob_fn = lambda model, batch: sequences.sequence_logprobs(model, batch, cfg.temperature)

  def loss_fn(params, batch, totals=None, key=None, share=1.0):
    with sharding.activate(mesh), lora.dropout_key(key), moe.collect() as routers:
      model = nnx.merge(graphdef, params)
      logp, entropy = logprob_fn(model, batch)
    loss, metrics = objective.policy_loss(logp, batch.old_logp, batch.adv, batch.mask, cfg,
                                ref_logp_nt=batch.ref_logp if cfg.uses_reference else None,
                                weight_nt=batch.weight, totals=totals)
    metrics["entropy"] = objective.masked_mean(entropy, batch.mask, totals)
    # MoE layers: router statistics, and the balance loss if the model asks for it.
    balance, router_metrics = moe.router_terms(model.cfg, routers, share)
    metrics.update(router_metrics)
    return loss + balance, metrics

  def step(state, batch):
    batch = with_routing(batch, cfg.routing_replay)
    key = (None if dropout_seed is None
           else jax.random.fold_in(jax.random.key(dropout_seed), state.step))
    m = (micro_count(batch.mask.shape[0], micro_batch_rows) if micro_batches is None
         else micro_batches(batch))
    grads_fn = optim.gradients if m == 1 else functools.partial(
        _accumulated, micro_batches=m, mesh=mesh)
    return optim.finite_step(functools.partial(loss_fn, key=key, share=1.0 / m), optimizer,
                             state, batch, trainable=trainable, grads_fn=grads_fn,
                             offload=offload)

  state_sh = optim.state_shardings(state, mesh)
  return jax.jit(step, in_shardings=(state_sh, optim.batch_shardings(mesh, example_batch)),
                 out_shardings=(state_sh, None), donate_argnums=(0,))


EXPERT_FIELDS = ("experts", "prompt_experts", "completion_experts")


def with_routing(batch, replay: bool):
  """The batch as the update's forward reads it: with routing replay, as it is (it must
  carry the sampler's recorded experts); without, its record dropped (the forward routes)."""
  names = [f.name for f in dataclasses.fields(batch) if f.name in EXPERT_FIELDS]
  recorded = any(getattr(batch, name) is not None for name in names)
  if replay and not recorded:
    raise ValueError("rl.routing_replay=true needs a batch with the sampler's recorded "
                     "experts (its `experts`), and this one has none")
  return batch if replay else dataclasses.replace(batch, **{name: None for name in names})


def _accumulated(loss_fn, params, batch, *, micro_batches: int, mesh: Mesh):
  """((loss, metrics), grads) of the whole batch, summed over its micro-batches in a scan;
  loss_fn(params, micro_batch, totals) gives each micro-batch's share."""
  totals = objective.Totals.of(batch.mask)
  with sharding.activate(mesh):
    micro = jax.tree.map(lambda x: sharding.constrain(x, (None, "batch") + (None,) * (x.ndim - 2)),
                         batch.micro_batches(micro_batches))
  one = lambda mb: jax.value_and_grad(loss_fn, has_aux=True)(params, mb, totals)
  first = jax.tree.map(lambda x: x[0], micro)
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(one, first))

  def body(acc, mb):
    return jax.tree.map(jnp.add, acc, one(mb)), None

  total, _ = jax.lax.scan(body, zeros, micro)
  return total


def micro_count(rows: int, micro_batch_rows: int | None) -> int:
  """How many micro-batches of micro_batch_rows a batch of `rows` makes (1 when unset or
  when the batch is no larger)."""
  if micro_batch_rows is None or rows <= micro_batch_rows:
    return 1
  if rows % micro_batch_rows:
    raise ValueError(f"a batch of {rows} rows does not split into micro-batches of "
                     f"{micro_batch_rows}")
  return rows // micro_batch_rows


def check_micro_batch_rows(rows: int | None, data_parallel: int) -> None:
  """rl.micro_batch_rows (`rows`) split evenly over the data-parallel devices, or one line."""
  if rows is not None and rows % data_parallel:
    raise BadInput(f"rl.micro_batch_rows={rows} does not split over the "
                   f"{data_parallel} data-parallel devices of the mesh")


def rows_sharding(mesh: Mesh, rows: int) -> NamedSharding:
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
  return jax.jit(run, out_shardings=None if rows is None else rows_sharding(mesh, rows))


def make_proximal_fn(graphdef, mesh: Mesh, temperature: float,
                     correction: correction_lib.Correction, rows: int, logprob_fn=None):
  """The importance correction of a batch's recomputed rows (rlcode.rl.correction): the
  decoupled-PPO correction of stale rows, or the rollout correction of every row.

  Returns jitted (params, batch, rows_n) -> (old_logp, weight, mask, metrics): for rows
  with rows_n true, old_logp becomes the proximal log-probs (under `params`, the
  trainer's policy at the start of the step) and weight and mask the correction's, from
  the behaviour log-probs the batch's old_logp holds (correction_lib.correct, which says
  what the metrics are); other rows keep their behaviour log-probs, weight 1 and mask.
  """
  if logprob_fn is None:
    logprob_fn = lambda model, batch: sequences.sequence_logprobs(model, batch, temperature)

  def run(params, batch, rows_n):
    with sharding.activate(mesh):
      prox, _ = logprob_fn(nnx.merge(graphdef, jax.lax.stop_gradient(params)), batch)
    weight, mask, metrics = correction_lib.correct(prox, batch.old_logp, batch.mask, rows_n,
                                                   correction)
    old = jnp.where(rows_n[:, None], prox, batch.old_logp)
    return old, weight, mask, metrics

  rows_sh = rows_sharding(mesh, rows)
  return jax.jit(run, out_shardings=(rows_sh, rows_sh, rows_sh, None))
