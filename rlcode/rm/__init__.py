"""Reward models learned from user choices.

  loss.py      the 1-of-k Plackett-Luce loss (Bradley-Terry at k = 2) and choice accuracy
  model.py     RewardModel: the policy's decoder, a pooled hidden state, optional
               ground-truth features, a scalar head
  batch.py     choices and (prompt, completion) pairs as token arrays
  train.py     the training loop (`rlcode train-rm`), its jitted update, checkpoints
  scorer.py    a trained reward model restored from its workdir, scoring completions
  reward.py    the "rm" reward of the registry (GRPO configs)
  features.py  ground-truth features of completions (tests passed, similarity, length)
  simulate.py  simulated users: candidates from a policy, a hidden utility, a noisy choice
"""
