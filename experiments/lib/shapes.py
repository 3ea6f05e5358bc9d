"""The model shapes the speed and GPU benchmarks time, and an H200's peaks.

QWEN2_05B is Qwen2-0.5B's shape (random weights: only speed is measured);
TINY the shape `--smoke` runs on a CPU in seconds. Not a claim of its own.
"""

from __future__ import annotations

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


def environment() -> dict:
  """The backend, jax version and devices a benchmark ran on (a field of its JSON)."""
  import jax
  return dict(backend=jax.default_backend(), jax=jax.__version__,
              devices=[str(d) for d in jax.devices()])
