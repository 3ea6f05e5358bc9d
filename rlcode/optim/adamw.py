"""The optimiser: AdamW after global-norm clipping, with a warmup and a decay schedule.

`OptimizerConfig` is the checked, typed form of a config's `optimizer` section (and
of `warmstart.optimizer`); `make_optimizer` turns it into an optax transformation.
This module must not know about models, batches or meshes (rlcode.optim.state does).
"""

from __future__ import annotations

import dataclasses

import optax

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
