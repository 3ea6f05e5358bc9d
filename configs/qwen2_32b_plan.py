"""A 32B Qwen2-shaped policy (Qwen2.5-32B's shapes), for `rlcode plan` only.

    rlcode plan --config configs/qwen2_32b_plan.py --devices gb200-nvl72 \
        --mesh fsdp=8,context=8 --sampler-mesh data=1,tensor=8 --prompt-len 131072

Hidden 5120, 64 layers, 40 query heads, 8 KV heads, SwiGLU width 27648, vocabulary
152064, untied embeddings, q/k/v biases, in bfloat16; each block rematerialised, layers
scanned, log-probs in chunks; a GRPO batch of 8 prompts x 8 samples with the prompt
computed once per group and split over the context axis.

Result: docs/results.md, "rlcode plan: fitting real models and long contexts".
"""

import ml_collections

from common import optimizer


def get_config():
  config = ml_collections.ConfigDict()
  config.trainer = "grpo"
  config.workdir = "workdirs/qwen2_32b_plan"
  config.mesh = ml_collections.ConfigDict(dict(fsdp=8, context=8))
  config.model = ml_collections.ConfigDict(dict(param_dtype="bfloat16", dtype="bfloat16",
                                                remat="full", scan_layers=True,
                                                logits_chunk=128))
  config.model.arch = ml_collections.ConfigDict(dict(
      vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_layers=64,
      num_heads=40, num_kv_heads=8, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
      qkv_bias=True, tie_embeddings=False, max_seq_len=139264))
  config.data = ml_collections.ConfigDict(dict(source="humaneval"))
  config.rewards = ml_collections.ConfigDict({"tests": 1.0})
  config.rl = ml_collections.ConfigDict(dict(
      group_size=8, prompts_per_step=8, max_new_tokens=4096, max_staleness=1))
  config.optimizer = optimizer(lr=1e-6, warmup=10, decay=1000)
  config.plan = ml_collections.ConfigDict(dict(prompt_len=131072))
  return config
