"""What the GPU check's scripts share: the model shapes, timing, the JSON they write.

QWEN2_05B is Qwen2-0.5B's shape (random weights: only speed is measured);
TINY the shape `--smoke` runs on a CPU in seconds. Not a claim of its own.
"""

from __future__ import annotations

import json
import os
import time

import jax

from rlcode.models import ModelConfig

QWEN2_05B = ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                        num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                        rope_theta=1e6, qkv_bias=True, tie_embeddings=True,
                        max_seq_len=1 << 21, param_dtype="bfloat16", dtype="bfloat16")
TINY = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True,
                   tie_embeddings=True, max_seq_len=4096)
# HBM bandwidth (bytes/s) and dense bfloat16 peak (FLOP/s) of an H200, from its data sheet.
H200_HBM_BYTES_PER_S = 4.8e12
H200_BF16_FLOPS = 989e12


def timed(fn, args, repeats: int, budget_s: float):
  """Compile, run once, then the best of up to `repeats` runs within `budget_s` seconds.

  Returns ({ms, runs, compile_s}, the output of the last run).
  """
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  out = jax.block_until_ready(compiled(*args))
  times = []
  while len(times) < repeats and (not times or sum(times) < budget_s):
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return dict(ms=min(times) * 1e3, runs=len(times), compile_s=compile_s), out


def write_json(obj, path: str) -> None:
  """Writes (rewrites) a result file, so a run cut short keeps the rows it finished."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w") as f:
    json.dump(obj, f, indent=1)


def environment() -> dict:
  return dict(backend=jax.default_backend(), jax=jax.__version__,
              devices=[str(d) for d in jax.devices()])
