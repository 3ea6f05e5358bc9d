"""Task streams that spend GRPO's rollouts where its groups carry a signal.

A GRPO group teaches only when its rewards differ: a task family the policy always
solves, or never does, fills a batch with groups whose advantages are all 0. DAPO's
dynamic sampling (rlcode.rl.dynamic) samples more and throws the
flat groups away, at the cost of the rollouts; this stream instead draws the next
tasks by family, each family weighted by the share of its recent groups that had a
signal (online difficulty filtering at the level of a family, in the spirit of Bae et
al. 2025's online filtering and of prioritised level replay, Jiang et al. 2021):

    P(family f) ∝ n_f * max(r_f, floor),   r_f = (s_f + 1) / (g_f + 2)

n_f is the family's number of tasks (so with no history the draw is the plain stream's
mix), s_f and g_f its groups with a signal and its groups, both decayed by `decay`
per update, and the floor keeps a family that has gone flat in the draw, since the
policy may move it again. Within a family the tasks come in a seeded permutation per
epoch, as rlcode.rollout.TaskStream's. The family choices of a step are drawn from
(seed, step), and the stream's state (positions and counts) is a small dict saved
with the checkpoint, so a resumed run draws what the uninterrupted one would.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from rlcode.data.tasks import Task


def family_of(task: Task) -> str:
  """A task's family: its extra's `family` where it has one (the tool tasks' file, search,
  tests; a practice task is in its variant's family here, while the agent's
  success/<family> metrics count it under "practice"), else the second part of its id
  ("agent/tests/mul/zap2" -> "tests"), else its whole id."""
  family = getattr(task.extra, "family", "")
  if family:
    return family
  parts = task.id.split("/")
  return parts[1] if len(parts) > 2 else task.id


class SignalCurriculum:
  """An endless, seeded, resumable stream of task batches, families weighted by their
  recent groups with signal (the module's docstring). `next()` as TaskStream's;
  `record(tasks, signal)` after each batch's groups are scored; `state()` for the
  checkpoint, and `state=` to resume."""

  def __init__(self, tasks: Sequence[Task], batch_size: int, seed: int, *,
               decay: float = 0.8, floor: float = 0.05, state: dict | None = None):
    if not tasks:
      raise ValueError("SignalCurriculum: no tasks")
    if not 0.0 <= decay < 1.0 or not 0.0 < floor <= 1.0:
      raise ValueError(f"SignalCurriculum: decay={decay} must be in [0, 1) and floor={floor} "
                       "in (0, 1]")
    by_family = collections.defaultdict(list)
    for task in tasks:
      by_family[family_of(task)].append(task)
    self.families = sorted(by_family)
    self.tasks = {f: by_family[f] for f in self.families}
    self.batch_size, self.seed, self.decay, self.floor = batch_size, seed, decay, floor
    self.position = 0  # batches handed out
    self.offsets = {f: 0 for f in self.families}  # tasks handed out, per family
    self.signal = {f: 0.0 for f in self.families}
    self.groups = {f: 0.0 for f in self.families}
    if state is not None:
      self._load(state)

  def rates(self) -> dict[str, float]:
    """Each family's estimated share of groups with a signal."""
    return {f: (self.signal[f] + 1.0) / (self.groups[f] + 2.0) for f in self.families}

  def weights(self) -> np.ndarray:
    rates = self.rates()
    w = np.array([len(self.tasks[f]) * max(rates[f], self.floor) for f in self.families])
    return w / w.sum()

  def next(self) -> list[Task]:
    rng = np.random.default_rng([self.seed, self.position])
    picks = rng.choice(len(self.families), self.batch_size, p=self.weights())
    out = []
    for k in picks:
      f = self.families[k]
      epoch, offset = divmod(self.offsets[f], len(self.tasks[f]))
      order = np.random.default_rng([self.seed, k, epoch]).permutation(len(self.tasks[f]))
      out.append(self.tasks[f][order[offset]])
      self.offsets[f] += 1
    self.position += 1
    return out

  def record(self, tasks: Sequence[Task], signal: Sequence[bool]) -> None:
    """One update's groups: tasks[i]'s group had rewards that differ when signal[i]."""
    if len(tasks) != len(signal):
      raise ValueError(f"{len(tasks)} tasks and {len(signal)} signal flags")
    for f in self.families:
      self.signal[f] *= self.decay
      self.groups[f] *= self.decay
    for task, s in zip(tasks, signal):
      f = family_of(task)
      if f in self.groups:
        self.groups[f] += 1.0
        self.signal[f] += float(bool(s))

  def state(self) -> dict:
    return {"position": self.position, "offsets": dict(self.offsets),
            "signal": dict(self.signal), "groups": dict(self.groups)}

  def _load(self, state: dict) -> None:
    if sorted(state["offsets"]) != self.families:
      raise ValueError(f"curriculum state: families {sorted(state['offsets'])}, but the "
                       f"tasks have {self.families}")
    self.position = int(state["position"])
    self.offsets = {f: int(v) for f, v in state["offsets"].items()}
    self.signal = {f: float(v) for f, v in state["signal"].items()}
    self.groups = {f: float(v) for f, v in state["groups"].items()}
