"""Which tasks and groups an agent step trains on: task selection, expert-guided groups,
and DAPO's dynamic sampling with a cap (rlcode.rl.dynamic's, which the GRPO loop shares).
"""

from __future__ import annotations

import re
import numpy as np
from rlcode.errors import BadInput
from rlcode.rl.dynamic import fill_with_signal, has_signal, round_seed

__all__ = ["fill_with_signal", "grpo_tasks", "guide_groups", "has_signal", "round_seed",
           "select_variants"]


def guide_groups(trajs, experts, group_size: int, slots: int):
  """Expert-guided groups: in each group of `group_size` sampled trajectories, the last
  `slots` are replaced by the task's expert episode (experts[g], or None: the group stays
  as sampled; the loop passes only experts that solved the task within the budgets).
  Returns (trajectories, guided: [N] bool, True on the expert rows)."""
  if not 0 <= slots < group_size:
    raise ValueError(f"rl.expert_slots must be in [0, group_size={group_size}), got {slots}: "
                     "a group needs at least one sampled trajectory")
  out, guided = list(trajs), np.zeros(len(trajs), bool)
  for g, episode in enumerate(experts):
    if episode is not None:
      for i in range((g + 1) * group_size - slots, (g + 1) * group_size):
        out[i], guided[i] = episode, True
  return out, guided


def grpo_tasks(pattern: str | None, tasks):
  """The training tasks GRPO samples: all, less those whose id matches the regular
  expression `pattern` (rl.exclude_task_ids; for example "^agent/practice/": practice
  tasks that are there to teach the warm start to copy). The warm start uses every task."""
  if pattern is None:
    return list(tasks)
  kept = [t for t in tasks if not re.search(pattern, t.id)]
  if not kept:
    raise BadInput(f"rl.exclude_task_ids={pattern!r} excludes all {len(tasks)} training tasks")
  return kept


def select_variants(keep, tasks):
  """The tasks of the families `keep` (config.agent.variants) names (all when it is empty)."""
  if not keep:
    return list(tasks)
  return [t for t in tasks if t.extra.family in keep]
