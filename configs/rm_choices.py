"""A reward model trained on simulated user choices among the tiny policy's candidates.

    rlcode train --config configs/grpo_tiny.py             # the policy whose decoder it starts from
    rlcode train-rm --config configs/rm_choices.py

The reward model is the tiny policy's decoder (configs/common.py) with a scalar head on
the last token's hidden state (rlcode.rm.model), started from the grpo_tiny warm start
(rm.init_from; "" starts from scratch), trained with the 1-of-k Plackett-Luce loss on
data/choices_tiny.jsonl; eval rows: choice accuracy and loss on the validation split.
`--config.rm.features="('tests_fraction','passed')"` also gives the model each
candidate's test results as inputs.

data/choices_tiny.jsonl (2112 train / 308 validation / 344 held-out choices, each 1 of 4
candidates; the splits are the tasks' splits) was written by

    python -m rlcode.rm.simulate --policy WORKDIR/warm_start --out data/choices_tiny.jsonl \
        --k 4 --choices-per-task validation=4,held_out=4,train=8 --workers 2

from the warm start of `rlcode train --config configs/grpo_tiny.py` (seed 0): candidates
sampled at temperature 1, the choice drawn by Plackett-Luce from the hidden utility
4 tests_fraction + 2 similarity - characters / 100, at temperature 1 (every feature and
utility is in each row's extra). 11.5% of training candidates pass their tests; naming
the highest-utility candidate agrees with the users 54% (train) / 48% (validation) /
49% (held out) of the time in expectation, the ceiling of any model; chance is 25%.
"""

import ml_collections

from common import optimizer, tiny_model

def get_config():
  config = ml_collections.ConfigDict()
  config.workdir = "workdirs/rm_choices"
  config.seed = 0
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
  config.model = tiny_model()
  config.data = ml_collections.ConfigDict(dict(
      path="data/choices_tiny.jsonl", data_dir="", held_out_fraction=0.2,
      train_split="train", eval_split="validation", max_train_choices=0, subset_seed=0))
  config.rm = ml_collections.ConfigDict(dict(
      pooling="last", head_hidden=64, features=(), init_from="workdirs/grpo_tiny/warm_start",
      batch_choices=16, max_candidates=0))
  config.optimizer = optimizer(lr=1e-3, warmup=10, decay=200)
  config.train = ml_collections.ConfigDict(dict(
      steps=200, eval_every=50, eval_steps=(), checkpoint_every=100, keep_checkpoints=1,
      progress_bar=True))
  return config
