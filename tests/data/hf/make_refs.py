"""Makes the tiny Hugging Face checkpoints and transformers' outputs the family tests read.

    python -m venv /tmp/refenv && /tmp/refenv/bin/pip install torch==2.13.0 'transformers>=5'
    /tmp/refenv/bin/python tests/data/hf/make_refs.py          # rewrites tests/data/hf/*/

Each case is a randomly initialised transformers model of one architecture (seeded; every
parameter drawn, norms and routers included, so a mislaid tensor shows in the logits),
saved by `save_pretrained` as it would come from the Hub (float32 unless the case says
bfloat16; sharded where the case says so), with `refs.json`: `input_ids` [2, 16] and the
float32 `logits` of transformers loading that checkpoint (rounded to 6 decimals), and `greedy_prompt` /
`greedy_output`: `generate(max_new_tokens=12, do_sample=False)` from a 6-token prompt. The
run needs torch, which rlcode's own environment does not have; the tests read the files.
"""

from __future__ import annotations

import json
import os
import shutil

import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)

# name: (model_type, config fields, options)
CASES = {
    "qwen3": ("qwen3", dict(head_dim=16, tie_word_embeddings=True), {}),
    "qwen3_yarn_bf16": ("qwen3", dict(head_dim=16, tie_word_embeddings=False, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64)),
        dict(dtype=torch.bfloat16, shard="40KB")),
    "qwen3_moe": ("qwen3_moe", dict(head_dim=8, num_experts=8, num_experts_per_tok=2,
                                    moe_intermediate_size=24, norm_topk_prob=True,
                                    mlp_only_layers=[1], tie_word_embeddings=False), {}),
    "qwen2_moe": ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                    shared_expert_intermediate_size=40, norm_topk_prob=False,
                                    tie_word_embeddings=False), dict(shard="100KB")),
    "qwen2_sliding": ("qwen2", dict(use_sliding_window=True, sliding_window=5, max_window_layers=1,
                                    tie_word_embeddings=True), {}),
    "mistral": ("mistral", dict(sliding_window=5, tie_word_embeddings=False), {}),
    "gemma3": ("gemma3_text", dict(
        head_dim=16, sliding_window=5, query_pre_attn_scalar=24, num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        hidden_activation="gelu_pytorch_tanh", rope_parameters=dict(
            full_attention=dict(rope_type="linear", factor=4.0, rope_theta=1000000.0),
            sliding_attention=dict(rope_type="default", rope_theta=10000.0))), {}),
    "olmo2": ("olmo2", dict(tie_word_embeddings=False), {}),
    "phi3": ("phi3", dict(tie_word_embeddings=False), {}),
    "llama_linear": ("llama", dict(rope_parameters=dict(rope_type="linear", factor=2.0,
                                                        rope_theta=10000.0)), {}),
}


def randomise(model: torch.nn.Module, seed: int) -> None:
  """Every parameter drawn: norms near their identity, routers wide enough that top-k is
  decided by margins far above float32 rounding."""
  gen = torch.Generator().manual_seed(seed)
  gemma = "gemma" in type(model).__name__.lower()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight") or "layernorm" in name or "_norm." in name:
        centre = 0.0 if gemma else 1.0
        p.copy_(centre + 0.1 * torch.randn(p.shape, generator=gen))
      elif ".gate.weight" in name or "router" in name:
        p.copy_(0.5 * torch.randn(p.shape, generator=gen))
      elif name.endswith("bias"):
        p.copy_(0.05 * torch.randn(p.shape, generator=gen))
      else:
        p.copy_(0.08 * torch.randn(p.shape, generator=gen))


def make(name: str, model_type: str, fields: dict, options: dict) -> None:
  out = os.path.join(HERE, name)
  shutil.rmtree(out, ignore_errors=True)
  cfg = transformers.AutoConfig.for_model(model_type, **(BASE | fields))
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
  randomise(model, seed=sum(map(ord, name)))
  gen = torch.Generator().manual_seed(1)
  ids = torch.randint(3, BASE["vocab_size"], (2, 16), generator=gen)
  prompt = torch.randint(3, BASE["vocab_size"], (1, 6), generator=gen)
  dtype = options.get("dtype", torch.float32)
  model = model.to(dtype)
  save = dict(max_shard_size=options["shard"]) if "shard" in options else {}
  model.save_pretrained(out, **save)
  # The references: transformers loading the saved checkpoint in float32 (a model cast
  # down and back would keep its rotary buffers rounded to the storage dtype).
  model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  with torch.no_grad():
    logits = model(ids).logits
    greedy = model.generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12,
                            eos_token_id=None, pad_token_id=0)
  refs = dict(model_type=model_type, input_ids=ids.tolist(),
              logits=[[[round(v, 6) for v in row] for row in seq] for seq in logits.tolist()],
              greedy_prompt=prompt.tolist(), greedy_output=greedy.tolist(),
              transformers=transformers.__version__, torch=torch.__version__)
  with open(os.path.join(out, "refs.json"), "w") as f:
    json.dump(refs, f)
  print(f"{name}: {type(model).__name__}, {sum(p.numel() for p in model.parameters())} params")


if __name__ == "__main__":
  for name, (model_type, fields, options) in CASES.items():
    make(name, model_type, fields, options)
