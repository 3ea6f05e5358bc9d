"""Rewards: functions from (tasks, completions) to scores, registered by name.

Reward code lives outside the update step: the loop calls `compute` on host
strings and hands the update only arrays. Each reward module registers itself
with `@register("name")`; a config mixes them with weights, for example
`config.rewards = {"tests": 1.0, "format": 0.1}`.
"""

from rlcode.rewards.registry import (RewardOutput, answer_ends, compute, get, names, options,
                                     register, register_answer_end)

__all__ = ["RewardOutput", "answer_ends", "compute", "get", "names", "options", "register",
           "register_answer_end"]
