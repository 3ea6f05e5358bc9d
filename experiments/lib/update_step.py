"""One GRPO update step timed both ways: the prompt repeated in every row, or computed once
per group (rlcode.rl.shared_prefix). speed/kv_reuse.py tables it on CPU,
speed/shared_prefix_update.py per token on a GPU.

CFG is kv_reuse's model (~14M parameters); the FLOP count is of CFG's shapes.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from experiments.lib.timing import best_time
from rlcode import optim
from rlcode.models import Decoder, ModelConfig
from rlcode.rl import grpo, objective, sequences, shared_prefix

CFG = ModelConfig(vocab_size=4096, hidden_size=384, intermediate_size=1024, num_layers=8,
                  num_heads=6, num_kv_heads=2, head_dim=64, qkv_bias=True,
                  tie_embeddings=True, max_seq_len=16384)
OPT = optim.OptimizerConfig(learning_rate=1e-4, warmup_steps=1, decay_steps=100)


def update_step_row(prompt_len, completion_len, group, repeats, mesh, cfg=CFG):
  """Times one update step of a `cfg` model both ways; returns the table row."""
  rng = np.random.default_rng(prompt_len)
  prompts = [rng.integers(1, cfg.vocab_size, prompt_len).tolist()]
  completions = [rng.integers(1, cfg.vocab_size, completion_len).tolist() for _ in range(group)]
  old = [np.full(completion_len, -1.0, np.float32)] * group
  adv = rng.normal(size=group).astype(np.float32)
  batches = {
      "repeated": sequences.sequence_batch(prompts, completions, [0] * group, pad_id=0,
                                           old_logp=old, adv=adv),
      "shared": shared_prefix.grouped_batch(prompts, completions, pad_id=0,
                                            completion_len=completion_len, old_logp=old,
                                            adv=adv)}
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, _ = nnx.split(model, nnx.Param)
  optimizer = optim.make_optimizer(OPT)
  loss_cfg = objective.LossConfig(max_completion_len=completion_len)
  row = {"prompt": prompt_len, "completion": completion_len, "group": group}
  for name, batch in batches.items():
    # The step donates its state, so each layout gets its own copy of the params.
    state = jax.tree.map(lambda x: x.copy(), optim.init_state(model, optimizer, mesh))
    fn = None if name == "repeated" else shared_prefix.logprob_fn(1.0)
    update = grpo.make_update_step(graphdef, optimizer, loss_cfg, mesh, state, batch,
                                   logprob_fn=fn)
    compiled = update.lower(state, batch).compile()
    mem = compiled.memory_analysis()
    row[f"{name}_peak_bytes"] = int(mem.argument_size_in_bytes + mem.output_size_in_bytes
                                    + mem.temp_size_in_bytes - mem.alias_size_in_bytes)
    holder = {"state": state}  # feed each call the state the last one returned

    def run():
      """One step, fed the state the last one returned; its loss."""
      holder["state"], metrics = compiled(holder["state"], batch)
      return metrics["loss"]
    row[f"{name}_seconds"] = best_time(run, repeats)
  row["speedup"] = row["repeated_seconds"] / row["shared_seconds"]
  row["memory_ratio"] = row["repeated_peak_bytes"] / row["shared_peak_bytes"]
  row["repeated_flops"] = forward_flops(prompt_len, completion_len, group, shared=False)
  row["shared_flops"] = forward_flops(prompt_len, completion_len, group, shared=True)
  row["flop_ratio"] = row["repeated_flops"] / row["shared_flops"]
  return row


def forward_flops(p: int, c: int, g: int, *, shared: bool) -> float:
  """Forward FLOPs of one update step's model pass (backward is ~2x the same, so the
  ratio of the two layouts is the ratio of these), for CFG's shapes.

  Counted: the layers' matmuls per token position (2 x their parameters), attention
  work per attended (query, key) pair (2 x 2 x heads x head_dim: q.k and p.v), and
  the output layer at the completion positions only (both layouts compute logits
  there alone). Repeated: G rows of P + C causal positions. Shared: the prompt once
  (causal), then G x C completion positions that see the whole prompt and their own
  earlier tokens.
  """
  cfg = CFG
  e, d, h, k = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
  per_token = 2 * (e * (h + 2 * k) * d + h * d * e + 3 * e * cfg.intermediate_size)
  per_pair = 2 * 2 * h * d
  causal = lambda n: n * (n + 1) // 2
  if shared:
    positions = p + g * c
    pairs = causal(p) + g * (c * p + causal(c))
  else:
    positions = g * (p + c)
    pairs = g * causal(p + c)
  logits = 2 * e * cfg.vocab_size * g * c
  return float(cfg.num_layers * (per_token * positions + per_pair * pairs) + logits)
