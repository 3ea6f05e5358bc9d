"""A Qwen3-8B-shaped policy at long context, for `rlcode plan` only.

    rlcode plan --config configs/qwen3_8b_plan.py --devices h200x8 --mesh fsdp=4,context=2

Hidden 4096, 36 layers, 32 query heads, 8 KV heads of 128, per-head q/k norms, SwiGLU
width 12288, vocabulary 151936, untied embeddings, in bfloat16. Each block
rematerialised, layers scanned, log-probs in chunks; a GRPO batch of 8 prompts of 32,768
tokens x 8 completions of 4,096, each prompt computed once per group and split over the
context axis.

Result: docs/results.md, "rlcode plan: MoE and Qwen3".
"""

from common import plan_job


def get_config():
  return plan_job(
      "qwen3_8b_plan", mesh=dict(fsdp=4, context=2), prompt_len=32768, max_new_tokens=4096,
      arch=dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
                num_heads=32, num_kv_heads=8, qk_norm="head", max_seq_len=40960,
                family="qwen3"))
