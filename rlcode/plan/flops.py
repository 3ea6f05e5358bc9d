"""Analytic FLOP counts of a config's programs: the update, the prefill, decoding.

Matmul FLOPs are 2 per multiply-add; attention counts the attended area (a causal
T x T block is about half of it). The planner prints them beside XLA's own count, which
sees a while loop's body once.
"""

from __future__ import annotations


def forward_parts(cfg, tokens: float, attended: float, logits: float) -> dict[str, float]:
  """FLOPs of a forward pass by part: the blocks' matmuls over `tokens` positions, the
  attention of queries that attend `attended` key positions in all (summed over queries),
  and the output layer on `logits` positions."""
  e, h, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  mlp = sum(_mlp_params(cfg, i) for i in range(cfg.num_layers))
  per_token = cfg.num_layers * (e * (h + 2 * k) * d + h * d * e) + mlp
  return {"matmul": 2 * per_token * tokens,
          "attention": 4 * cfg.num_layers * h * d * attended,
          "logits": 2 * e * cfg.vocab_size * logits}


def _mlp_params(cfg, i: int) -> int:
  """The MLP weights one token multiplies by in layer i: the SwiGLU's, or in an MoE layer
  the router's, its top_k experts' and a shared expert's."""
  e = cfg.hidden_size
  if not cfg.is_moe_layer(i):
    return 3 * e * cfg.intermediate_size
  moe = cfg.moe
  shared = 3 * e * moe.shared_intermediate_size + e if moe.shared_intermediate_size else 0
  return e * moe.num_experts + moe.top_k * 3 * e * moe.intermediate_size + shared


def forward_flops(cfg, tokens: float, attended: float, logits: float) -> float:
  """FLOPs of a forward pass (forward_parts, summed)."""
  return sum(forward_parts(cfg, tokens, attended, logits).values())


def update_flops(cfg, prompts: int, rows: int, prompt_len: int, completion_len: int,
                 shared_prefix: bool) -> tuple[float, float, float]:
  """(forward, forward + backward + recomputation, recomputation) FLOPs of one update over
  the whole batch.

  The backward pass of a matmul is two of its forward (the input's gradient and the
  weight's); a frozen weight (the base under cfg.lora) needs only the first. Attention's
  backward is twice its forward. Rematerialisation (cfg.remat) recomputes in the backward
  pass what the forward did not keep: the whole forward for "full", attention for "dots"
  and "offload" (the matmul outputs are kept); chunked log-probs (cfg.logits_chunk)
  recompute the output layer. LoRA's own matmuls (rank << width) are left out."""
  if shared_prefix:
    tokens = prompts * prompt_len + rows * completion_len
    attended = (prompts * prompt_len * (prompt_len + 1) / 2
                + rows * completion_len * (prompt_len + (completion_len + 1) / 2))
  else:
    seq = prompt_len + completion_len
    tokens, attended = rows * seq, rows * seq * (seq + 1) / 2
  parts = forward_parts(cfg, tokens, attended, rows * completion_len)
  forward = sum(parts.values())
  weights = 1 if cfg.lora is not None else 2
  backward = weights * (parts["matmul"] + parts["logits"]) + 2 * parts["attention"]
  recompute = {"none": 0.0, "full": parts["matmul"] + parts["attention"],
               "dots": parts["attention"], "offload": parts["attention"]}[cfg.remat]
  if cfg.logits_chunk:
    recompute += parts["logits"]
  return forward, forward + backward + recompute, recompute


def decode_flops(cfg, rows: int, prompt_len: int, new_tokens: int) -> float:
  attended = rows * (new_tokens * prompt_len + new_tokens * (new_tokens + 1) / 2)
  return forward_flops(cfg, rows * new_tokens, attended, rows * new_tokens)


def prefill_flops(cfg, prompts: int, prompt_len: int) -> float:
  return forward_flops(cfg, prompts * prompt_len, prompts * prompt_len * (prompt_len + 1) / 2,
                       prompts)
