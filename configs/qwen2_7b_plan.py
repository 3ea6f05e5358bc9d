"""A 7B Qwen2-shaped policy, for `rlcode plan` only (nothing here is ever allocated).

    rlcode plan --config configs/qwen2_7b_plan.py --devices h200x8 --mesh fsdp=8
    rlcode plan --config configs/qwen2_7b_plan.py --devices gb200-nvl72 \
        --mesh data=8,fsdp=8 --sampler-mesh data=2,tensor=4

Qwen2-7B's shape (hidden 3584, 28 layers, 28 query heads, 4 KV heads, SwiGLU width 18944,
vocabulary 152064, untied embeddings, q/k/v biases) in bfloat16, with a GRPO batch of 8
prompts x 8 samples, 1024-token prompts and 1024-token completions, the prompt computed
once per group. Tensor parallelism can split at most the 4 KV heads (tensor <= 4).

Result (docs/results.md): on h200x8 at fsdp=8 the update peaks at 22.6 GB a device (180 GB
without remat, scanning and chunked log-probs); on a GB200 NVL72 rack 18.1 GB and an
estimated 0.64 s a step.
"""

import ml_collections

from common import optimizer


def get_config():
  config = ml_collections.ConfigDict()
  config.trainer = "grpo"
  config.workdir = "workdirs/qwen2_7b_plan"
  config.mesh = ml_collections.ConfigDict(dict(fsdp=8))
  # What makes the update fit (docs/results.md, "fit"): each block rematerialised, the
  # layers scanned, log-probs 128 positions at a time.
  config.model = ml_collections.ConfigDict(dict(param_dtype="bfloat16", dtype="bfloat16",
                                                remat="full", scan_layers=True,
                                                logits_chunk=128))
  config.model.arch = ml_collections.ConfigDict(dict(
      vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
      num_heads=28, num_kv_heads=4, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
      qkv_bias=True, tie_embeddings=False, max_seq_len=32768))
  config.data = ml_collections.ConfigDict(dict(source="humaneval"))
  config.rewards = ml_collections.ConfigDict({"tests": 1.0})
  config.rl = ml_collections.ConfigDict(dict(
      group_size=8, prompts_per_step=8, max_new_tokens=1024, max_staleness=1))
  config.optimizer = optimizer(lr=1e-6, warmup=10, decay=1000)
  config.plan = ml_collections.ConfigDict(dict(prompt_len=1024))
  return config
