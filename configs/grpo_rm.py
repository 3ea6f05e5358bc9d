"""GRPO on the tiny tasks with a learned reward: the reward model of configs/rm_choices.py
instead of the tests (evaluation still by the tests, which the run never trains on).

    rlcode train --config configs/rm_choices.py        # the reward model first
    rlcode train --config configs/grpo_rm.py

Result (seed 0, docs/results.md): held-out pass@1 0.076 -> 0.036 after 40 steps, against
0.076 -> 0.099 with the tests reward: the learned reward is exploited.
"""

import ml_collections

import grpo_tiny


def get_config():
  config = grpo_tiny.get_config("references")  # the policy its reward model was made for
  config.workdir = "workdirs/grpo_rm"
  config.rewards = ml_collections.ConfigDict({"rm": 1.0})
  config.reward_options = ml_collections.ConfigDict({"rm": {"checkpoint": "workdirs/rm_choices"}})
  return config
