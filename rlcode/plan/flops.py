"""Analytic FLOP counts of a config's programs: the update, the prefill, decoding.

Matmul FLOPs are 2 per multiply-add; attention counts the attended area (a causal
T x T block is about half of it). The planner prints them beside XLA's own count, which
sees a while loop's body once.
"""

from __future__ import annotations



def forward_flops(cfg, tokens: float, attended: float, logits: float) -> float:
  """FLOPs of a forward pass over `tokens` positions whose queries attend `attended`
  key positions in all (summed over queries), with `logits` output positions."""
  e, f, h, k, d = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                   cfg.head_dim)
  per_layer = e * (h + 2 * k) * d + h * d * e + 3 * e * f
  matmul = 2 * cfg.num_layers * per_layer * tokens
  attention = 4 * cfg.num_layers * h * d * attended
  return matmul + attention + 2 * e * cfg.vocab_size * logits


def update_flops(cfg, prompts: int, rows: int, prompt_len: int, completion_len: int,
                 shared_prefix: bool) -> tuple[float, float]:
  """(forward FLOPs, forward + backward FLOPs) of one update over the whole batch."""
  if shared_prefix:
    tokens = prompts * prompt_len + rows * completion_len
    attended = (prompts * prompt_len * (prompt_len + 1) / 2
                + rows * completion_len * (prompt_len + (completion_len + 1) / 2))
  else:
    seq = prompt_len + completion_len
    tokens, attended = rows * seq, rows * seq * (seq + 1) / 2
  forward = forward_flops(cfg, tokens, attended, rows * completion_len)
  return forward, 3 * forward


def decode_flops(cfg, rows: int, prompt_len: int, new_tokens: int) -> float:
  attended = rows * (new_tokens * prompt_len + new_tokens * (new_tokens + 1) / 2)
  return forward_flops(cfg, rows * new_tokens, attended, rows * new_tokens)


def prefill_flops(cfg, prompts: int, prompt_len: int) -> float:
  return forward_flops(cfg, prompts * prompt_len, prompts * prompt_len * (prompt_len + 1) / 2,
                       prompts)
