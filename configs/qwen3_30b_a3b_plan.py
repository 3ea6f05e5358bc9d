"""A Qwen3-30B-A3B-shaped MoE policy (128 experts, 8 a token), for `rlcode plan` only.

    rlcode plan --config configs/qwen3_30b_a3b_plan.py --devices h200x8 --mesh fsdp=2,expert=4

Hidden 2048, 48 layers, 32 query heads, 4 KV heads of 128, per-head q/k norms, every
layer's MLP 128 SwiGLU experts of width 768 with top-8 routing (renormalised), vocabulary
151936, untied embeddings, in bfloat16: 30.5B parameters, 3.3B active a token. Each block
rematerialised, layers scanned, log-probs in chunks; experts split over the expert axis.
A GRPO batch of 8 prompts x 8 samples, 1,024 + 1,024 tokens, the prompt once per group.

Result: docs/results.md, "rlcode plan: MoE and Qwen3".
"""

from common import plan_job


def get_config():
  # The grouped matmul planned is the tiled one: its memory is a grouped GEMM's (rows
  # padded to tiles); ragged_dot lowers on fake CPU devices to a masked dense product.
  return plan_job(
      "qwen3_30b_a3b_plan", mesh=dict(fsdp=2, expert=4), prompt_len=1024, max_new_tokens=1024,
      arch=dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=48,
                num_heads=32, num_kv_heads=4, qk_norm="head", max_seq_len=40960,
                family="qwen3_moe",
                moe=dict(num_experts=128, top_k=8, intermediate_size=768, norm_topk_prob=True,
                         impl="tiled", tile=128)))
