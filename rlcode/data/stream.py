"""An endless, seeded, resumable stream of batches from a list of items (tasks, choices).
"""

from __future__ import annotations

from collections.abc import Sequence
import numpy as np
from rlcode.data.tasks import Task


class TaskStream:
  """An endless, seeded, resumable stream of task batches.

  Epoch e visits the tasks in the permutation drawn from (seed, e). The stream's
  whole state is `position`, the number of tasks handed out so far.
  """

  def __init__(self, tasks: Sequence[Task], batch_size: int, seed: int, position: int = 0):
    if not tasks:
      raise ValueError("TaskStream: no tasks")
    self.tasks, self.batch_size, self.seed, self.position = list(tasks), batch_size, seed, position

  def _order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

  def next(self) -> list[Task]:
    out = []
    for i in range(self.position, self.position + self.batch_size):
      epoch, offset = divmod(i, len(self.tasks))
      out.append(self.tasks[self._order(epoch)[offset]])
    self.position += self.batch_size
    return out
