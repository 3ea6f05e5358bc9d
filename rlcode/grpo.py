"""GRPO: group-relative advantages, the clipped policy loss, and the jitted update.

Algorithms are configuration plus functions: advantage estimators and loss
aggregations are registered by name and chosen in the config (`rl.advantage`,
`rl.loss_aggregation`). The update step is one `jax.jit` (forward, backward,
clipping, optimiser) with explicit input and output shardings.

Batches arrive as `SequenceBatch`: every row is a prompt followed by its
completion, right-padded, with a window of target positions where the completion
is predicted (logits are computed there only); `mask` marks the window's
positions that are completion tokens. (rlcode.shared_prefix holds the layout where a group's
prompt is computed once.) This module must not know where rewards come from.

Stale samples (rlcode.async_rollouts: drawn from a policy some versions behind the
trainer) are corrected by the decoupled PPO objective (Hilton et al. 2021, "Batch
size-invariance for policy optimization"; AReaL, Fu et al. 2025): the ratio is
clipped against the proximal policy (the trainer's at the start of the step) instead
of the behaviour policy, and each token is weighted by pi_prox / pi_behav truncated
at a cap (`make_proximal_fn`). For an on-policy sample the proximal policy is the
behaviour policy: its log-probs are used as they are and the weight is exactly 1.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlcode import losses, sharding
from rlcode.errors import BadInput, UnknownKey

# --------------------------------------------------------------------------- advantages


def _grpo(rewards_n, group_size, eps):
  r = rewards_n.reshape(-1, group_size)
  centred = r - r.mean(axis=1, keepdims=True)
  return (centred / (r.std(axis=1, keepdims=True) + eps)).reshape(-1)


def _dr_grpo(rewards_n, group_size, eps):
  del eps  # Dr.GRPO drops the std scaling, which over-weights near-uniform groups
  r = rewards_n.reshape(-1, group_size)
  return (r - r.mean(axis=1, keepdims=True)).reshape(-1)


ADVANTAGES: dict[str, Callable] = {"grpo": _grpo, "dr_grpo": _dr_grpo}


def group_advantages(rewards_n, group_size: int, estimator: str = "grpo", eps: float = 1e-6,
                     negative_weight: float = 1.0):
  """Advantages [N] for rewards [N] laid out prompt-major in groups of group_size.

  negative_weight scales the negative advantages (samples below their group's mean):
  1.0 is the estimator as published; 0.0 keeps only the positive ones, so the update
  raises the likelihood of a group's better samples and pushes nothing down (the
  "positive sample reinforcement" arm of Zhu et al. 2025, "The Surprising
  Effectiveness of Negative Reinforcement in LLM Reasoning"); values between weigh the
  two halves, as their W-REINFORCE does from the other side."""
  if estimator not in ADVANTAGES:
    raise UnknownKey(f"rl.advantage={estimator!r}; known: {sorted(ADVANTAGES)}")
  if not 0.0 <= negative_weight <= 1.0:
    raise BadInput(f"rl.negative_weight={negative_weight!r}: must be in [0, 1]")
  rewards_n = np.asarray(rewards_n, np.float32)
  if rewards_n.ndim != 1 or rewards_n.shape[0] % group_size:
    raise ValueError(f"{rewards_n.shape[0]} rewards do not split into groups of {group_size}")
  adv = ADVANTAGES[estimator](rewards_n, group_size, eps)
  return np.where(adv < 0, adv * negative_weight, adv).astype(np.float32)


def advantages_from_config(rl) -> Callable[[np.ndarray], np.ndarray]:
  """rewards [N] -> advantages [N] with the rl section's estimator (`rl.advantage`),
  group size and `rl.negative_weight` (1.0 when absent). The settings are checked here,
  so that a trainer that builds this before its warm start fails before it, not at the
  first GRPO step."""
  estimator, group_size = rl.advantage, rl.group_size
  negative_weight = float(rl.get("negative_weight", 1.0))
  group_advantages(np.zeros(group_size), group_size, estimator,
                   negative_weight=negative_weight)  # raises on a bad setting
  return lambda rewards_n: group_advantages(rewards_n, group_size, estimator,
                                            negative_weight=negative_weight)


# --------------------------------------------------------------------------- losses


def _seq_mean_token_mean(loss_nt, mask_nt, max_len):
  del max_len  # the original GRPO: each sequence's mean, then the mean over sequences
  per_seq = jnp.sum(loss_nt * mask_nt, 1) / jnp.maximum(jnp.sum(mask_nt, 1), 1.0)
  has = (jnp.sum(mask_nt, 1) > 0).astype(loss_nt.dtype)
  return jnp.sum(per_seq * has) / jnp.maximum(jnp.sum(has), 1.0)


def _token_mean(loss_nt, mask_nt, max_len):
  del max_len  # DAPO: every token of the batch weighs the same
  return jnp.sum(loss_nt * mask_nt) / jnp.maximum(jnp.sum(mask_nt), 1.0)


def _seq_mean_token_sum_norm(loss_nt, mask_nt, max_len):
  # Dr.GRPO: token sums divided by one constant (the generation budget), no
  # per-sequence length normalisation, so long wrong answers are not favoured.
  return jnp.sum(loss_nt * mask_nt) / (loss_nt.shape[0] * max_len)


AGGREGATIONS: dict[str, Callable] = {
    "seq_mean_token_mean": _seq_mean_token_mean,
    "token_mean": _token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """The policy-loss hyperparameters (hashable: a jit static argument)."""

  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2
  beta: float = 0.0
  # Log KL(policy || reference) as "kl" even when beta = 0 (the reference
  # log-probs are then computed for the metric only; the loss is unchanged).
  log_kl: bool = False
  aggregation: str = "seq_mean_token_mean"
  max_completion_len: int = 1
  temperature: float = 1.0

  def __post_init__(self):
    if self.aggregation not in AGGREGATIONS:
      raise KeyError(f"rl.loss_aggregation={self.aggregation!r}; known: {sorted(AGGREGATIONS)}")

  @property
  def uses_reference(self) -> bool:
    """Whether the update reads reference log-probs (the KL term or its metric)."""
    return self.beta > 0 or self.log_kl

  @classmethod
  def from_config(cls, rl, max_completion_len: int) -> LossConfig:
    return cls(clip_eps_low=rl.clip_eps_low, clip_eps_high=rl.clip_eps_high, beta=rl.beta,
               log_kl=bool(rl.get("log_kl", False)), aggregation=rl.loss_aggregation,
               max_completion_len=max_completion_len, temperature=rl.temperature)


def masked_mean(x_nt, mask_nt):
  """Mean of x over the positions where mask is 1; what is elsewhere never reaches the sum."""
  valid = mask_nt > 0
  return (jnp.sum(jnp.where(valid, x_nt, 0.0))
          / jnp.maximum(jnp.sum(valid.astype(jnp.float32)), 1.0))


def policy_loss(logp_nt, old_logp_nt, adv_n, mask_nt, cfg: LossConfig, ref_logp_nt=None,
                weight_nt=None):
  """The clipped surrogate plus beta * KL(policy || reference), aggregated by name.

  Per token: -w * min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) with
  r = exp(logp - old_logp) and w = weight_nt (the decoupled objective's truncated
  proximal/behaviour weight; 1 when not given), plus beta * k3 where
  k3 = exp(ref - logp) - (ref - logp) - 1 (Schulman's unbiased, positive estimator).
  Given reference log-probs, metrics["kl"] is the mean k3, also when beta = 0.
  Log-ratios are selected by the mask before they are exponentiated: whatever sits at
  masked positions (padding, prompt, -inf log-probs) never reaches exp, and inf * 0 never
  makes a NaN. Returns (loss, metrics).
  """
  valid = mask_nt > 0
  mask = valid.astype(jnp.float32)
  ratio = jnp.exp(jnp.where(valid, logp_nt - old_logp_nt, 0.0))
  adv = adv_n[:, None]
  clipped = jnp.clip(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
  surrogate = jnp.minimum(ratio * adv, clipped * adv)
  if weight_nt is not None:
    surrogate = surrogate * weight_nt
  pg_nt = jnp.where(valid, -surrogate, 0.0)
  aggregate = functools.partial(AGGREGATIONS[cfg.aggregation], mask_nt=mask,
                                max_len=cfg.max_completion_len)
  metrics = {"pg_loss": aggregate(pg_nt),
             "clip_frac": masked_mean((jnp.abs(ratio - clipped) > 0).astype(jnp.float32), mask),
             "ratio": masked_mean(ratio, mask)}
  loss_nt = pg_nt
  if cfg.beta > 0 and ref_logp_nt is None:
    raise ValueError("rl.beta > 0 needs reference log-probabilities")
  if ref_logp_nt is not None:
    d = jnp.where(valid, ref_logp_nt - logp_nt, 0.0)
    kl_nt = jnp.exp(d) - d - 1.0
    if cfg.beta > 0:
      loss_nt = pg_nt + cfg.beta * kl_nt
    metrics["kl"] = masked_mean(kl_nt, mask)
  loss = aggregate(loss_nt)
  metrics["loss"] = loss
  return loss, metrics


# --------------------------------------------------------------------------- batches and state


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SequenceBatch:
  """Rows of prompt + completion, right-padded to one length L, and a window of W target
  positions per row where that row's completion is predicted.

  tokens: [N, L] int32. start: [N] int32, the position whose output predicts the row's
  first completion token (its prompt's length - 1). mask, old_logp, ref_logp, weight:
  [N, W], aligned with the targets tokens[i, start[i] + 1 + j] (mask 1 on completion
  tokens, proximal and reference log-probabilities there, 0 elsewhere; weight the
  truncated pi_prox / pi_behav, 1 for on-policy rows). adv: [N].
  The output layer runs on the W window positions only: a prompt's positions never
  become logits (what TRL calls logits_to_keep).
  """

  tokens: jax.Array
  start: jax.Array
  mask: jax.Array
  old_logp: jax.Array
  ref_logp: jax.Array
  adv: jax.Array
  weight: jax.Array

  @classmethod
  def abstract(cls, rows: int) -> SequenceBatch:
    """Leaves with the true row count and rank (lengths vary per step and do not matter):
    enough to choose the batch's shardings before the first batch exists."""
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    return cls(tokens=jax.ShapeDtypeStruct((rows, 2), jnp.int32),
               start=jax.ShapeDtypeStruct((rows,), jnp.int32), mask=f32(rows, 1),
               old_logp=f32(rows, 1), ref_logp=f32(rows, 1), adv=f32(rows),
               weight=f32(rows, 1))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  params: nnx.State
  opt_state: optax.OptState
  step: jax.Array


SCHEDULES = ("cosine", "wsd")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW after global-norm clipping, with a learning-rate schedule:
    "cosine": linear warmup, then cosine decay to end_lr_fraction at decay_steps;
    "wsd": warmup-stable-decay: linear warmup, the peak rate held, then a linear
      cooldown over the last cooldown_steps before decay_steps to end_lr_fraction.
  Both hold the end rate after decay_steps. Configs hold it as a ConfigDict (so keys can
  be overridden on the command line); `from_config` turns that into this checked, typed
  value."""

  learning_rate: float
  warmup_steps: int = 0
  decay_steps: int = 1
  end_lr_fraction: float = 0.1
  grad_clip: float = 1.0
  b1: float = 0.9
  b2: float = 0.99
  weight_decay: float = 0.0
  schedule: str = "cosine"
  cooldown_steps: int = 0

  def __post_init__(self):
    if self.schedule not in SCHEDULES:
      raise ValueError(f"optimizer.schedule={self.schedule!r}; known: {list(SCHEDULES)}")
    if self.schedule == "wsd" and not (
        0 < self.cooldown_steps <= self.decay_steps - self.warmup_steps):
      raise ValueError(f"optimizer.cooldown_steps={self.cooldown_steps} must be in (0, "
                       f"decay_steps - warmup_steps = {self.decay_steps - self.warmup_steps}] "
                       "for the wsd schedule")
    if not self.learning_rate > 0:
      raise ValueError(f"optimizer.learning_rate must be > 0, got {self.learning_rate}")
    if self.warmup_steps < 0 or self.decay_steps < 0:
      raise ValueError(f"optimizer.warmup_steps={self.warmup_steps} and decay_steps="
                       f"{self.decay_steps} must be >= 0")
    if not 0 <= self.end_lr_fraction <= 1:
      raise ValueError(f"optimizer.end_lr_fraction must be in [0, 1], got "
                       f"{self.end_lr_fraction}")
    if not self.grad_clip > 0:
      raise ValueError(f"optimizer.grad_clip must be > 0, got {self.grad_clip}")

  @classmethod
  def from_config(cls, cfg) -> OptimizerConfig:
    """From a mapping (a config's `optimizer` ConfigDict); unknown keys are an error."""
    values = dict(cfg)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise KeyError(f"optimizer config: unknown key(s) {unknown}; valid: {sorted(known)}")
    return cls(**values)


def make_optimizer(opt: OptimizerConfig) -> optax.GradientTransformation:
  """AdamW with the config's schedule (OptimizerConfig), after global-norm clipping."""
  if not isinstance(opt, OptimizerConfig):
    raise TypeError(f"make_optimizer takes an OptimizerConfig (OptimizerConfig.from_config "
                    f"turns a config's optimizer section into one), got {type(opt).__name__}")
  schedule = learning_rate_schedule(opt)
  # optax counts from 0, where warmup gives a zero rate: the first update would be lost.
  shifted = lambda count: schedule(count + 1)
  return optax.chain(
      optax.clip_by_global_norm(opt.grad_clip),
      optax.adamw(shifted, b1=opt.b1, b2=opt.b2, weight_decay=opt.weight_decay))


def learning_rate_schedule(opt: OptimizerConfig) -> optax.Schedule:
  """The rate at optax's count (from 0; warmup starts at a zero rate)."""
  peak, end = opt.learning_rate, opt.learning_rate * opt.end_lr_fraction
  warmup = max(opt.warmup_steps, 1)
  if opt.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=warmup,
        decay_steps=max(opt.decay_steps, opt.warmup_steps + 1), end_value=end)
  stable = opt.decay_steps - opt.cooldown_steps
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak),
       optax.linear_schedule(peak, end, opt.cooldown_steps)],
      boundaries=[warmup, stable])  # stable >= warmup: OptimizerConfig checks it


def opt_state_shardings(optimizer: optax.GradientTransformation, params, mesh: Mesh):
  """Shardings of the optimiser state of `params` (concrete or abstract, with shardings):
  each moment laid out like its parameter, everything else (counts) replicated.

  Left to itself, jit(optimizer.init) replicates the moments (zeros do not depend on
  their parameter's values, so its layout does not propagate): under FSDP every device
  would hold every moment, 8 bytes per parameter for a float32 Adam.
  """
  replicated = NamedSharding(mesh, P())
  like = lambda x: (x.sharding if isinstance(x.sharding, NamedSharding)
                    and x.sharding.mesh == mesh else replicated)
  return optax.tree_map_params(
      optimizer, lambda _, s: s, jax.eval_shape(optimizer.init, params),
      jax.tree.map(like, params), transform_non_params=lambda _: replicated)


def init_state(model: nnx.Module, optimizer: optax.GradientTransformation,
               mesh: Mesh) -> TrainState:
  """The model's params, fresh optimiser state (moments sharded like their params,
  scalars replicated over the mesh) and step 0."""
  params = nnx.state(model, nnx.Param)
  replicated = NamedSharding(mesh, P())
  # Every optimiser leaf gets a NamedSharding on the mesh: the jitted step returns
  # such shardings, and any other kind in the input would make its second call
  # recompile (a mismatch in the jit cache key).
  opt_state = jax.jit(optimizer.init,
                      out_shardings=opt_state_shardings(optimizer, params, mesh))(params)
  return TrainState(params=params, opt_state=opt_state,
                    step=jax.device_put(jnp.zeros((), jnp.int32), replicated))


def batch_shardings(mesh: Mesh, example) -> object:
  """Row-sharded over the batch axes, whatever the leaf's rank (`example` may be abstract)."""
  def one(x):
    return NamedSharding(mesh, sharding.logical_to_spec(
        ("batch",) + (None,) * (x.ndim - 1), x.shape, mesh=mesh, what="batch"))
  return jax.tree.map(one, example)


def state_shardings(state: TrainState, mesh: Mesh):
  """Shardings of a TrainState: params by their axes, optimiser moments likewise."""
  return jax.tree.map(lambda x: getattr(x, "sharding", NamedSharding(mesh, P())), state)


def window_logits(model, batch: SequenceBatch) -> tuple[jax.Array, jax.Array]:
  """Logits [N, W, V] at each row's window positions and the targets [N, W] they predict.

  The decoder runs over every position (attention needs the prompt); the output layer
  runs on the W window positions only.
  """
  h, _ = model.hidden(batch.tokens[:, :-1])
  w = batch.mask.shape[1]
  pos = jnp.minimum(batch.start[:, None] + jnp.arange(w, dtype=jnp.int32)[None, :],
                    batch.tokens.shape[1] - 2)
  h_window = jnp.take_along_axis(h, pos[..., None], axis=1)
  return model.logits(h_window), jnp.take_along_axis(batch.tokens, pos + 1, axis=1)


def sequence_logprobs(model, batch: SequenceBatch, temperature: float):
  """Log-probabilities and entropies [N, W] of the targets in each row's window (the
  softmax and the entropy on the window positions only, as `window_logits`)."""
  return losses.token_logprobs_and_entropy(*window_logits(model, batch), temperature)


def finite_step(loss_fn, optimizer: optax.GradientTransformation, state: TrainState, batch):
  """One optimiser step on `loss_fn(params, batch) -> (loss, metrics)`, taken only when the
  loss and the gradient norm are finite: otherwise params, optimiser state and step count
  stay as they were. Returns (state, metrics + {"grad_norm", "skipped"}). Traced inside
  the caller's jit (the GRPO update, the reward model's)."""
  (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
  grad_norm = optax.tree.norm(grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
  metrics.update(grad_norm=grad_norm, skipped=1.0 - ok.astype(jnp.float32))
  return TrainState(params=keep(params, state.params), opt_state=keep(opt_state, state.opt_state),
                    step=state.step + ok.astype(jnp.int32)), metrics


def run_passes(update, state: TrainState, batch, passes: int, *, step: int,
               on_nonfinite: str):
  """`passes` calls of a compiled update on one batch: (state, the last pass's metrics on
  the host, seconds). A skipped (non-finite) step raises when on_nonfinite is "stop"."""
  start = time.perf_counter()
  for _ in range(passes):
    state, m = update(state, batch)
  m = jax.device_get(m)
  seconds = time.perf_counter() - start
  if m["skipped"] and on_nonfinite == "stop":
    raise FloatingPointError(f"step {step}: non-finite loss or gradient "
                             f"(loss={m['loss']}, grad_norm={m['grad_norm']})")
  return state, m, seconds


def make_update_step(graphdef, optimizer: optax.GradientTransformation, cfg: LossConfig,
                     mesh: Mesh, state: TrainState, example_batch: SequenceBatch,
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
    logprob_fn = lambda model, batch: sequence_logprobs(model, batch, cfg.temperature)

  def loss_fn(params, batch):
    with sharding.activate(mesh):
      model = nnx.merge(graphdef, params)
      logp, entropy = logprob_fn(model, batch)
    loss, metrics = policy_loss(logp, batch.old_logp, batch.adv, batch.mask, cfg,
                                ref_logp_nt=batch.ref_logp if cfg.uses_reference else None,
                                weight_nt=batch.weight)
    metrics["entropy"] = masked_mean(entropy, batch.mask)
    return loss, metrics

  step = functools.partial(finite_step, loss_fn, optimizer)

  state_sh = state_shardings(state, mesh)
  return jax.jit(step, in_shardings=(state_sh, batch_shardings(mesh, example_batch)),
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
    logprob_fn = lambda model, batch: sequence_logprobs(model, batch, temperature)

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
    logprob_fn = lambda model, batch: sequence_logprobs(model, batch, temperature)

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
    metrics = {"iw_clip_frac": masked_mean((raw > max_weight).astype(jnp.float32), mask),
               "iw_mean": masked_mean(weight, mask)}
    return old, weight, metrics

  rows_sh = _rows_sharding(mesh, rows)
  return jax.jit(run, out_shardings=(rows_sh, rows_sh, None))
