"""A policy's life cycle: its training state, the supervised step and warm start, restoring
it from a checkpoint, evaluating it, and exporting it. Above models/, optim/ and runs/;
the loops in rlcode.train, rm/ and serve/ use it, and it imports none of them.

  training.py    what every RL loop holds of its policy (graph, optimiser, reference,
                 checkpoint bundle)
  sft.py         supervised steps: warm starts and cross-entropy controls
  warm_start.py  the warm start before GRPO: its tasks, seed and cache
  policy_eval.py a policy's (or a checkpoint's) held-out evaluation and selection among
                 its samples
  export.py      `rlcode export`: a trained policy as a Hugging Face directory
"""
