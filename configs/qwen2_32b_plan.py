"""A 32B Qwen2-shaped policy (Qwen2.5-32B's shapes), for `rlcode plan` only.

    rlcode plan --config configs/qwen2_32b_plan.py --devices gb200-nvl72 \
        --mesh fsdp=8,context=8 --sampler-mesh data=1,tensor=8 --prompt-len 131072

Hidden 5120, 64 layers, 40 query heads, 8 KV heads, SwiGLU width 27648, vocabulary
152064, untied embeddings, q/k/v biases, in bfloat16; each block rematerialised, layers
scanned, log-probs in chunks; a GRPO batch of 8 prompts x 8 samples with the prompt
computed once per group and split over the context axis.

Result: docs/results.md, "rlcode plan: fitting real models and long contexts".
"""

from common import plan_job


def get_config():
  return plan_job(
      "qwen2_32b_plan", mesh=dict(fsdp=8, context=8), prompt_len=131072, max_new_tokens=4096,
      arch=dict(vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_layers=64,
                num_heads=40, num_kv_heads=8, qkv_bias=True, max_seq_len=139264))
