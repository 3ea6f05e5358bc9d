"""The optimiser: AdamW after global-norm clipping, with a warmup and a decay schedule.

`OptimizerConfig` is the checked, typed form of a config's `optimizer` section (and
of `warmstart.optimizer`); `make_optimizer` turns it into an optax transformation.
This module must not know about models, batches or meshes (rlcode.optim.state does).
"""

from __future__ import annotations

import dataclasses

import optax

from rlcode.fields import check, hints, key

SCHEDULES = ("cosine", "wsd")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW after global-norm clipping, with a learning-rate schedule.

  "cosine": linear warmup, then cosine decay to end_lr_fraction at decay_steps; "wsd"
  (warmup-stable-decay): linear warmup, the peak rate held, then a linear cooldown over
  the last cooldown_steps before decay_steps to end_lr_fraction. Both hold the end rate
  after decay_steps. This is the schema of a config's `optimizer` section (and of
  `warmstart.optimizer`); `from_config` turns that section into this checked value.

  Attributes:
    learning_rate: the peak learning rate.
    warmup_steps: steps of linear warmup from 0 to the peak.
    decay_steps: the step at which the rate reaches end_lr_fraction of the peak.
    end_lr_fraction: the final rate as a fraction of the peak.
    grad_clip: the global gradient norm gradients are clipped to.
    b1: Adam's first-moment decay.
    b2: Adam's second-moment decay.
    weight_decay: AdamW's decoupled weight decay.
    schedule: "cosine" or "wsd" (warmup, stable, linear cooldown).
    cooldown_steps: "wsd": the linear cooldown's length, ending at decay_steps.
    offload: keep the optimiser state in pinned host memory; each update brings it to
      the device, steps it and writes it back (rlcode.optim.state). Needs a backend with
      a pinned_host memory kind (GPU, TPU; CPU has one too, for tests).
  """

  learning_rate: float = key(gt=0)
  warmup_steps: int = key(0, ge=0)
  decay_steps: int | None = key(None, ge=0, derived="train.steps (warmstart.steps for the "
                                "warm start's optimizer)")
  end_lr_fraction: float = key(0.1, ge=0, le=1)
  grad_clip: float = key(1.0, gt=0)
  b1: float = key(0.9, ge=0, lt=1)
  b2: float = key(0.99, ge=0, lt=1)
  weight_decay: float = key(0.0, ge=0)
  schedule: str = key("cosine", choices=SCHEDULES)
  cooldown_steps: int = key(0, ge=0)
  offload: bool = key(False)

  def __post_init__(self):
    for name in ("learning_rate", "warmup_steps", "end_lr_fraction", "grad_clip", "b1", "b2",
                 "weight_decay", "schedule", "cooldown_steps"):
      check(f"optimizer.{name}", getattr(self, name), hints(OptimizerConfig)[name],
            FIELDS[name])
    if self.decay_steps is None:
      raise ValueError("optimizer.decay_steps is not set (a config derives it from the "
                       "steps it trains for)")
    if self.decay_steps < 0:
      raise ValueError(f"optimizer.decay_steps={self.decay_steps} must be >= 0")
    if self.schedule == "wsd" and not (
        0 < self.cooldown_steps <= self.decay_steps - self.warmup_steps):
      raise ValueError(f"optimizer.cooldown_steps={self.cooldown_steps} must be in (0, "
                       f"decay_steps - warmup_steps = {self.decay_steps - self.warmup_steps}] "
                       "for the wsd schedule")

  @classmethod
  def from_config(cls, cfg) -> OptimizerConfig:
    """From a mapping (a config's `optimizer` ConfigDict); unknown keys are an error."""
    values = dict(cfg)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise KeyError(f"optimizer config: unknown key(s) {unknown}; valid: {sorted(known)}")
    return cls(**values)


FIELDS = {f.name: f for f in dataclasses.fields(OptimizerConfig)}


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
