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

from common import plan_job


def get_config():
  return plan_job(
      "qwen2_7b_plan", mesh=dict(fsdp=8), prompt_len=1024, max_new_tokens=1024,
      arch=dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                num_heads=28, num_kv_heads=4, qkv_bias=True, max_seq_len=32768))
