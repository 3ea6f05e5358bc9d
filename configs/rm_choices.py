"""A reward model trained on simulated user choices among the tiny policy's candidates.

    rlcode train-rm --config configs/rm_choices.py

The reward model is the tiny policy's decoder (configs/common.py) with a scalar head on
the last token's hidden state, started from the grpo_tiny warm start when
rm.init_from names it, trained with the 1-of-k Plackett-Luce loss on
data/choices_tiny.jsonl (written by rlcode.rm.simulate from a grpo_tiny policy; each
choice is 1 of 4 candidates, drawn from a hidden utility of tests passed, similarity to
the reference and length). Eval rows: choice accuracy and loss on the validation split.
`--config.rm.features="('tests_fraction','passed')"` gives the model the candidates' test
results as extra inputs.

Expected result: see EXPECTED below (measured on 2 shared CPU cores).
"""

import ml_collections

from common import optimizer, tiny_model

EXPECTED = "filled in by the measured run"


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
      pooling="last", head_hidden=64, features=(), init_from="", batch_choices=16,
      max_candidates=0))
  config.optimizer = optimizer(lr=1e-3, warmup=10, decay=200)
  config.train = ml_collections.ConfigDict(dict(
      steps=200, eval_every=50, eval_steps=(), checkpoint_every=100, keep_checkpoints=1,
      progress_bar=True))
  return config
