"""Sampling from the tiny byte-level decoder, randomly initialised: the generation path
from config to mesh, sharded init, the compiled sampler and JSON lines.

    rlcode sample --config configs/sample_tiny.py

Writes workdir/samples.jsonl (12 completions: random bytes, the model is untrained) and
prints the decode throughput.
"""

import ml_collections

from common import tiny_model


def get_config():
  config = ml_collections.ConfigDict()
  config.trainer = "sample"
  config.workdir = "workdirs/sample_tiny"
  config.model = tiny_model()
  config.sampling = ml_collections.ConfigDict(dict(max_new_tokens=64, group_size=4))
  config.prompts = ("def add(a, b):\n", "def is_even(n):\n", "# reverse a string\n")
  return config
