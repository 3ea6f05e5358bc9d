"""Sampling from a tiny byte-level decoder initialised from scratch.

A smoke job for generation: it exercises the whole path from config to mesh,
sharded initialisation, the compiled sampler and the JSONL output.
A randomly initialised model writes random bytes; that is expected.

    rlcode sample --config configs/sample_tiny.py

Writes workdir/samples.jsonl (one object per completion) and prints the first
few completions and the decode throughput.
"""

import ml_collections

from common import tiny_model


def get_config():
  config = ml_collections.ConfigDict()
  config.workdir = "workdirs/sample_tiny"
  config.seed = 0
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
  config.model = tiny_model()
  config.sampling = ml_collections.ConfigDict(dict(
      max_new_tokens=64, temperature=1.0, top_p=1.0, top_k=0, group_size=4))
  config.prompts = ("def add(a, b):\n", "def is_even(n):\n", "# reverse a string\n")
  return config
