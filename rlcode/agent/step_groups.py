"""Which tasks and groups an agent step trains on: task selection, expert-guided groups,
DAPO's dynamic sampling with a cap.
"""

from __future__ import annotations

import re
import numpy as np
from rlcode.errors import BadInput


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


def has_signal(group, reward) -> bool:
  """Whether a group's rewards (reward(item) of each) are not all equal."""
  return len({reward(item) for item in group}) > 1


def fill_with_signal(sample_round, group_size: int, groups: int, rounds: int, *,
                     reward=lambda item: item.reward):
  """DAPO's dynamic sampling (Yu et al. 2025), with a cap on the rounds.

  sample_round(r) returns round r's items (`groups` groups of `group_size`, group-major;
  reward(item) is an item's final reward). Rounds run until `groups` groups whose
  rewards are not all equal have been kept, or `rounds` rounds have run. A batch still
  short then is filled with the last round's flat groups, whose advantages are 0 (with
  beta = 0 they add nothing to the gradient, as in plain GRPO). rounds = 1 is plain
  GRPO: the first round's groups as they came.

  Returns (the batch's items, groups * group_size of them; every item drawn, in order;
  the rounds run).
  """
  kept, drawn = [], []
  for r in range(rounds):
    items = sample_round(r)
    if len(items) != groups * group_size:
      raise ValueError(f"round {r}: {len(items)} items, expected {groups} x {group_size}")
    drawn += items
    if rounds == 1:
      return items, drawn, 1
    flat = []
    for i in range(0, len(items), group_size):
      chunk = items[i:i + group_size]
      (kept if has_signal(chunk, reward) else flat).append(chunk)
    if len(kept) >= groups:
      break
  batch = (kept + flat)[:groups]
  return [item for chunk in batch for item in chunk], drawn, r + 1


def grpo_tasks(config, tasks):
  """The training tasks GRPO samples: all, less those whose id matches the regular
  expression rl.exclude_task_ids (for example "^agent/practice/": practice tasks that
  are there to teach the warm start to copy). The warm start uses every task."""
  pattern = config.rl.exclude_task_ids
  if pattern is None:
    return list(tasks)
  kept = [t for t in tasks if not re.search(pattern, t.id)]
  if not kept:
    raise BadInput(f"rl.exclude_task_ids={pattern!r} excludes all {len(tasks)} training tasks")
  return kept


def select_variants(config, tasks):
  """The tasks of the families config.agent.variants names (all when it is empty)."""
  keep = config.agent.variants
  if not keep:
    return list(tasks)
  return [t for t in tasks if t.extra.family in keep]
