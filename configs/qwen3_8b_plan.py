"""A Qwen3-8B-shaped policy at long context, for `rlcode plan` only.

    rlcode plan --config configs/qwen3_8b_plan.py --devices h200x8 --mesh fsdp=4,context=2

Hidden 4096, 36 layers, 32 query heads, 8 KV heads of 128, per-head q/k norms, SwiGLU
width 12288, vocabulary 151936, untied embeddings, in bfloat16. Each block
rematerialised, layers scanned, log-probs in chunks; a GRPO batch of 8 prompts of 32,768
tokens x 8 completions of 4,096, each prompt computed once per group and split over the
context axis.

Result: docs/results.md, "rlcode plan: MoE and Qwen3".
"""

import ml_collections

from common import optimizer


def get_config():
  config = ml_collections.ConfigDict()
  config.trainer = "grpo"
  config.workdir = "workdirs/qwen3_8b_plan"
  config.mesh = ml_collections.ConfigDict(dict(fsdp=4, context=2))
  config.model = ml_collections.ConfigDict(dict(param_dtype="bfloat16", dtype="bfloat16",
                                                remat="full", scan_layers=True,
                                                logits_chunk=128))
  config.model.arch = ml_collections.ConfigDict(dict(
      vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
      num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
      qk_norm="head", tie_embeddings=False, max_seq_len=40960, family="qwen3"))
  config.data = ml_collections.ConfigDict(dict(source="humaneval"))
  config.rewards = ml_collections.ConfigDict({"tests": 1.0})
  config.rl = ml_collections.ConfigDict(dict(
      group_size=8, prompts_per_step=8, max_new_tokens=4096, max_staleness=1))
  config.optimizer = optimizer(lr=1e-6, warmup=10, decay=1000)
  config.plan = ml_collections.ConfigDict(dict(prompt_len=32768))
  return config
