"""The training loops, each read top to bottom, and what they share.

  grpo_loop.py   GRPO on single-turn tasks (`rlcode train`, trainer "grpo")
  agent_loop.py  GRPO over multi-turn tool-use episodes (trainer "agent")
  rm_loop.py     a reward model on user choices (`rlcode train-rm`, trainer "rm")
"""
