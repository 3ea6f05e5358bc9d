"""Simulated users: candidates sampled from a policy, a choice drawn from a hidden utility.

For each task, k candidates are sampled from a policy; their ground-truth features
(rlcode.rm.features: tests passed, similarity to the reference, length) give each a
utility u = sum_name weight[name] * feature[name], which the user does not state; the user
picks candidate i with probability softmax(u / temperature)_i, the first stage of a
Plackett-Luce ranking (drawn by Gumbel-max). Temperature 0 picks the best candidate
(ties to the first). Every feature, the utilities and the temperature are recorded in the
choice's extra, so experiments can compare a reward model with the utility's own choices.

    python -m rlcode.rm.simulate --policy WORKDIR --out choices.jsonl [--k 4]
        [--choices-per-task train=8,validation=4,held_out=4] [--temperature 1.0]
        [--weights tests_fraction=4,similarity=2,length=-1] [--seed 0]

The policy is a training workdir (or its warm_start/); its recorded config names the
tasks. This module must not train anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Mapping, Sequence

import numpy as np

from rlcode.data.choices import Choice, write_choices
from rlcode.data.tasks import Task
from rlcode.rm import features as features_lib

DEFAULT_WEIGHTS = {"tests_fraction": 4.0, "similarity": 2.0, "length": -1.0}


@dataclasses.dataclass(frozen=True)
class Utility:
  """The hidden utility (weights over rlcode.rm.features.FEATURES) and the choice noise."""

  weights: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
  temperature: float = 1.0

  def __post_init__(self):
    unknown = sorted(set(self.weights) - set(features_lib.FEATURES))
    if unknown:
      raise ValueError(f"utility weights name unknown feature(s) {unknown}; known: "
                       f"{list(features_lib.FEATURES)}")
    if not self.temperature >= 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")

  def of(self, table: Mapping[str, Sequence[float]]) -> np.ndarray:
    """Utilities of candidates whose features are table[name][i]."""
    n = len(next(iter(table.values())))
    u = np.zeros(n, np.float64)
    for name, w in self.weights.items():
      u += w * np.asarray(table[name], np.float64)
    return u


def plackett_luce_choice(utilities: Sequence[float], temperature: float,
                         rng: np.random.Generator) -> int:
  """Index drawn with probability softmax(u / temperature) (argmax at temperature 0)."""
  u = np.asarray(utilities, np.float64)
  if temperature == 0:
    return int(np.argmax(u))
  return int(np.argmax(u / temperature + rng.gumbel(size=u.shape)))


def choice_probabilities(utilities: Sequence[float], temperature: float) -> np.ndarray:
  """softmax(u / temperature); one-hot on the first best at temperature 0."""
  u = np.asarray(utilities, np.float64)
  if temperature == 0:
    return np.eye(len(u))[int(np.argmax(u))]
  z = np.exp(u / temperature - np.max(u / temperature))
  return z / z.sum()


def choices_from_samples(tasks: Sequence[Task], samples: Sequence[Sequence[str]], *, k: int,
                         utility: Utility, rng: np.random.Generator, split: str | None = None,
                         table: Mapping[str, np.ndarray] | None = None, workers=None,
                         source: str = "") -> list[tuple[Choice, str | None]]:
  """Choices over consecutive groups of k of each task's samples.

  samples[i] are task i's completions (a multiple of k). `table` (feature name -> values
  over all samples, task-major) skips computing features when given.
  """
  flat_tasks = [t for t, s in zip(tasks, samples) for _ in s]
  flat = [c for s in samples for c in s]
  if any(len(s) % k for s in samples):
    raise ValueError(f"every task needs a multiple of k={k} samples")
  if table is None:
    names = list(features_lib.FEATURES)
    values = features_lib.compute(flat_tasks, flat, names, workers=workers)
    table = {n: values[:, j] for j, n in enumerate(names)}
  out, at = [], 0
  for task, s in zip(tasks, samples):
    for g in range(len(s) // k):
      idx = range(at, at + k)
      feats = {n: [round(float(table[n][i]), 6) for i in idx] for n in table}
      u = utility.of(feats)
      chosen = plackett_luce_choice(u, utility.temperature, rng)
      code = [features_lib.shown_code(task, flat[i]) for i in idx]
      extra = {"task_id": task.id, "features": feats, "utility": [round(float(x), 6) for x in u],
               "temperature": utility.temperature, "weights": dict(utility.weights)}
      if source:
        extra["source"] = source
      out.append((Choice(f"{task.id}/{g}", task.prompt, tuple(code), chosen, extra), split))
      at += k
  return out


def simulate(policy_path: str, out: str, *, k: int, per_task: Mapping[str, int],
             utility: Utility, seed: int, sample_temperature: float = 1.0,
             workers: int | None = None) -> dict:
  """Samples candidates from the policy at `policy_path` for every split of its tasks,
  draws the choices, writes them to `out`; returns counts and timings."""
  # Deferred: sampling a policy brings in jax and the models, which rlcode.serve.users,
  # reading only the utility and the choice rule, does not need.
  from rlcode.parallel import sharding
  from rlcode.policy import policy_eval
  from rlcode.rl import rollout
  from rlcode.data import sources
  from rlcode.config.record import recorded_config
  config = recorded_config(policy_path, "--policy")
  mesh = sharding.mesh_from_config(config.mesh)
  recipe = policy_eval.Recipe.of(config.model, config.optimizer, config.rl, config.seed)
  model, tokenizer, step, _ = policy_eval.restore_policy(recipe, policy_path, mesh)
  rng = np.random.default_rng(seed)
  rows, stats = [], {"policy": policy_path, "policy_step": step, "k": k}
  for split, n in per_task.items():
    start = time.perf_counter()
    tasks, _ = rollout.fit_tasks(sources.load(config.data, split), tokenizer, split=split,
                                 max_seq_len=model.cfg.max_seq_len,
                                 max_new_tokens=config.rl.max_new_tokens, drop_too_long=True)
    row_tasks, texts = policy_eval.sample_completions(
        model, tokenizer, tasks, num_samples=n * k, temperature=sample_temperature,
        max_new_tokens=config.rl.max_new_tokens, seed=seed * 7919 + len(rows), mesh=mesh,
        progress=True)
    samples = [texts[i * n * k:(i + 1) * n * k] for i in range(len(tasks))]
    rows += choices_from_samples(tasks, samples, k=k, utility=utility, rng=rng, split=split,
                                 workers=workers, source=f"{policy_path}@{step}")
    stats[split] = {"tasks": len(tasks), "choices": len(tasks) * n,
                    "seconds": time.perf_counter() - start}
  write_choices(out, rows)
  return stats


def _pairs(text: str, cast) -> dict:
  out = {}
  for item in filter(None, text.split(",")):
    name, _, value = item.partition("=")
    out[name.strip()] = cast(value)
  return out


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--policy", required=True, help="a policy workdir or checkpoint dir")
  parser.add_argument("--out", required=True, help="the choices file to write")
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--choices-per-task", default="train=8,validation=4,held_out=4")
  parser.add_argument("--weights", default=",".join(f"{n}={w:g}"
                                                    for n, w in DEFAULT_WEIGHTS.items()))
  parser.add_argument("--temperature", type=float, default=1.0, help="the users' noise")
  parser.add_argument("--sample-temperature", type=float, default=1.0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--workers", type=int, default=None)
  args = parser.parse_args(argv)
  utility = Utility(_pairs(args.weights, float), args.temperature)
  stats = simulate(args.policy, args.out, k=args.k, per_task=_pairs(args.choices_per_task, int),
                   utility=utility, seed=args.seed, sample_temperature=args.sample_temperature,
                   workers=args.workers)
  print(stats)


if __name__ == "__main__":
  main()
