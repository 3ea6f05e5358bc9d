"""The training loops, each read top to bottom, and what they share.

  grpo_loop.py   GRPO on single-turn tasks (`rlcode train`, trainer "grpo")
  agent_loop.py  GRPO over multi-turn tool-use episodes (trainer "agent")
  harness_loop.py  GRPO on an outside harness's episodes through the OpenAI API (trainer
                 "harness"): the policy served in process, rlcode.harness's rollouts
  rm_loop.py     a reward model on user choices (`rlcode train-rm`, trainer "rm")
  online_loop.py  GRPO on the served policy's logged interactions (`rlcode learn-online`)
  scaffold.py    the run every loop holds: workdir, config record, resume, metrics,
                 checkpoints
"""
