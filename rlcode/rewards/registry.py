"""The reward registry and the weighted mix the training loop calls."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlcode.data.tasks import Task
from rlcode.rewards.config import kwargs


@dataclasses.dataclass
class RewardOutput:
  """Per-completion scores plus whatever the reward wants logged.

  `scores` is float32 [N]. `metrics` holds scalars (means over the batch) that
  the loop writes to metrics.jsonl under `reward/<name>/...`. `details` holds
  per-completion records (statuses, test counts) for inspection, never logged
  as metrics.
  """

  scores: np.ndarray
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  details: list[dict[str, Any]] = dataclasses.field(default_factory=list)


# fn(tasks, completions, **options) -> RewardOutput, with len(tasks) == len(completions).
RewardFn = Callable[..., RewardOutput]

_REGISTRY: dict[str, RewardFn] = {}
# Modules that register rewards; imported lazily so that, for example, the
# semantic reward's encoder is not loaded by a job that only runs tests.
_MODULES = {
    "tests": "rlcode.rewards.tests",
    "format": "rlcode.rewards.tests",
    "diff": "rlcode.rewards.diffs",
    "swe_tests": "rlcode.rewards.swe",
    "semantic": "rlcode.rewards.semantic",
    "rm": "rlcode.rm.reward",
    "gym": "rlcode.rewards.gym",
}


# fn(task, completion, **options) -> how many leading characters of the completion the
# reward reads (a reward that cuts at stop sequences reads less than the whole text).
AnswerEndFn = Callable[..., int]
_ANSWER_ENDS: dict[str, AnswerEndFn] = {}


def register_answer_end(name: str) -> Callable[[AnswerEndFn], AnswerEndFn]:
  """Declares how much of a completion reward `name` reads; without one, all of it."""
  def wrap(fn: AnswerEndFn) -> AnswerEndFn:
    _ANSWER_ENDS[name] = fn
    return fn
  return wrap


def answer_ends(weights: Mapping[str, float], tasks: Sequence[Task],
                completions: Sequence[str],
                options: Mapping[str, Mapping[str, Any]] | None = None) -> np.ndarray:
  """Per completion, how many leading characters any configured reward reads.

  What lies beyond (text after a stop sequence that every reward cuts away) cannot
  change a reward, so the training loop keeps its tokens out of the loss.
  """
  options = options or {}
  ends = np.zeros(len(completions), np.int64)
  for name, weight in weights.items():
    if weight == 0:
      continue
    get(name)  # imports the module, which registers its answer end if it has one
    fn = _ANSWER_ENDS.get(name)
    for i, (task, text) in enumerate(zip(tasks, completions)):
      end = len(text) if fn is None else fn(task, text, **dict(options.get(name, {})))
      ends[i] = max(ends[i], end)
  return ends


def register(name: str) -> Callable[[RewardFn], RewardFn]:
  def wrap(fn: RewardFn) -> RewardFn:
    if name in _REGISTRY and _REGISTRY[name] is not fn:
      raise ValueError(f"reward {name!r} is registered twice")
    _REGISTRY[name] = fn
    return fn
  return wrap


def names() -> list[str]:
  return sorted(set(_REGISTRY) | set(_MODULES))


def get(name: str) -> RewardFn:
  if name not in _REGISTRY and name in _MODULES:
    importlib.import_module(_MODULES[name])
  if name not in _REGISTRY:
    raise KeyError(f"unknown reward {name!r}; known rewards are {names()}")
  return _REGISTRY[name]


def compute(weights: Mapping[str, float], tasks: Sequence[Task],
            completions: Sequence[str],
            options: Mapping[str, Mapping[str, Any]] | None = None) -> RewardOutput:
  """The weighted sum of the named rewards, with each one's metrics prefixed.

  Args:
    weights: reward name -> weight. Zero weights are skipped (not computed).
    tasks: one task per completion (a GRPO group repeats its task G times).
    completions: decoded completion texts.
    options: reward name -> keyword options for that reward.
  """
  if len(tasks) != len(completions):
    raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
  if not weights:
    raise ValueError("no rewards configured: give at least one name -> weight")
  options = options or {}
  total = np.zeros(len(completions), np.float32)
  metrics: dict[str, float] = {}
  details: list[dict[str, Any]] = [{} for _ in completions]
  for name, weight in weights.items():
    if weight == 0:
      continue
    out = get(name)(tasks, completions, **dict(options.get(name, {})))
    scores = np.asarray(out.scores, np.float32)
    if scores.shape != (len(completions),):
      raise ValueError(f"reward {name!r} returned shape {scores.shape}, "
                       f"expected ({len(completions)},)")
    if not np.all(np.isfinite(scores)):
      raise ValueError(f"reward {name!r} returned non-finite scores")
    total += weight * scores
    metrics[f"{name}/mean"] = float(scores.mean())
    metrics.update({f"{name}/{k}": float(v) for k, v in out.metrics.items()})
    for d, extra in zip(details, out.details):
      d[name] = extra
  return RewardOutput(total, metrics, details if any(details) else [])


def options(reward_options: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
  """A config's reward_options section (rlcode.rewards.config.RewardOptions) as each
  reward's keyword options (reward name -> keywords)."""
  return {name: kwargs(opts) for name, opts in reward_options.items()}
