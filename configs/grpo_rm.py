"""GRPO on the tiny tasks with a learned reward: a reward model of user choices instead of
the tests.

    rlcode train-rm --config configs/rm_choices.py        # the reward model first
    rlcode train --config configs/grpo_rm.py

configs/grpo_tiny.py in every other respect (the same warm start, schedule and
evaluation: held-out pass@1 by the tests, which this run never trains on); the reward is
the "rm" reward (rlcode.rm.reward) of the model in reward_options.rm.checkpoint.
experiments/grpo_rm.py compares it with the tests reward over seeds.
"""

import ml_collections

import grpo_tiny


def get_config():
  config = grpo_tiny.get_config()
  config.workdir = "workdirs/grpo_rm"
  config.rewards = ml_collections.ConfigDict({"rm": 1.0})
  config.reward_options = ml_collections.ConfigDict({
      "rm": {"checkpoint": "workdirs/rm_choices"}})
  return config
