"""A reward model trained on simulated user choices among the tiny policy's candidates.

    rlcode train --config configs/grpo_tiny.py:references   # the policy whose decoder it starts from
    rlcode train --config configs/rm_choices.py
    rlcode train --config configs/rm_choices.py --config.rm.features="('tests_fraction','passed')"

The tiny policy's decoder with a scalar head on the last token's hidden state
(rlcode.rm.model), started from the grpo_tiny warm start, trained with the 1-of-k
Plackett-Luce loss on data/choices_tiny.jsonl (1 of 4 candidates, written by
`python -m rlcode.rm.simulate`; the hidden utility is in each row's extra).

Result (3 seeds, docs/results.md): held-out choice accuracy 0.294 ± 0.011 text only,
0.484 ± 0.007 with test results (ceiling 0.489, chance 0.25).
"""

import ml_collections

from common import optimizer, tiny_model


def get_config():
  config = ml_collections.ConfigDict()
  config.trainer = "rm"
  config.workdir = "workdirs/rm_choices"
  config.model = tiny_model()
  config.data = ml_collections.ConfigDict(dict(source="choices", path="data/choices_tiny.jsonl"))
  config.rm = ml_collections.ConfigDict(dict(init_from="workdirs/grpo_tiny/warm_start"))
  config.optimizer = optimizer(lr=1e-3, warmup=10)
  config.train = ml_collections.ConfigDict(dict(
      steps=200, eval_every=50, checkpoint_every=100, keep_checkpoints=1))
  return config
