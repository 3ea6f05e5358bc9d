"""KV reuse, measured: the shared-prompt GRPO update and the document KV store.

1. One GRPO update step (forward, backward, AdamW) on G = 8 completions of one
   prompt, with the prompt computed once per group (rlcode.shared_prefix) versus
   repeated in every row (the standard layout), same model (~14M parameters),
   same batch, side by side, for prompt lengths 256 ... 4096 and 128-token
   completions. Both layouts run the output layer at completion positions only
   (the repeated layout's window, like TRL's logits_to_keep), so the comparison
   is against a baseline that skips the work it does not need. The FLOP ratio
   counts matmuls per position and attention work per attended pair
   (`forward_flops`). Peak memory is XLA's own account of each compiled step
   (`compiled.memory_analysis()`: arguments + outputs + temporaries).
2. A query over 16 cached documents after one of them is swapped for a new one
   (rlcode.doc_store: one document prefilled, then the query against all 16),
   versus a full prefill of the packed documents and query (whose output layer
   also runs at the query's positions only).

    python experiments/kv_reuse.py [--quick]

Prints two tables and one grep-able summary line per target, writes
experiments/out/kv_reuse.json. Times are the best of --repeats runs after a
compile run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlcode.parallel import sharding
from rlcode.rl import shared_prefix
from rlcode import optim
from rlcode.rl import grpo
from rlcode.rl import objective
from rlcode.rl import sequences  # noqa: E402
from rlcode.sampling.doc_store import DocumentStore  # noqa: E402
from rlcode.models import Decoder, ModelConfig  # noqa: E402

CFG = ModelConfig(vocab_size=4096, hidden_size=384, intermediate_size=1024, num_layers=8,
                  num_heads=6, num_kv_heads=2, head_dim=64, qkv_bias=True,
                  tie_embeddings=True, max_seq_len=16384)
OPT = optim.OptimizerConfig(learning_rate=1e-4, warmup_steps=1, decay_steps=100)


def best_time(fn, repeats):
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return min(times)


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
  ratio of the two layouts is the ratio of these).

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


def doc_store_row(num_docs, doc_len, query_len, repeats):
  cfg = CFG.replace(attention_pattern=("document",))
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(0)
  docs = [rng.integers(1, cfg.vocab_size, doc_len).tolist() for _ in range(num_docs)]
  query = rng.integers(1, cfg.vocab_size, query_len).tolist()
  tokens = jnp.asarray([sum(docs, []) + query])
  seg = jnp.asarray([sum([[i] * doc_len for i in range(num_docs)], []) + [num_docs] * query_len])

  @jax.jit
  def full_prefill(state, tokens, seg):
    # The baseline runs the output layer on the query's positions only, as the store does.
    model = nnx.merge(graphdef, state)
    h, _ = model.hidden(tokens, segment_ids=seg)
    return model.logits(h[:, -query_len:])[0]

  full = best_time(lambda: full_prefill(state, tokens, seg), repeats)
  store = DocumentStore(model, budget_bytes=1 << 32)
  store.query(docs, query)  # fills the store and compiles the query program
  fresh = iter(rng.integers(1, cfg.vocab_size, (repeats + 1, doc_len)).tolist())
  swap_at = num_docs // 2

  def swapped():
    docs[swap_at] = next(fresh)
    result = store.query(docs, query)
    assert result.computed == 1 and result.reused == num_docs - 1
    return result.logits
  swap = best_time(swapped, repeats)
  check = np.asarray(full_prefill(state, jnp.asarray([sum(docs, []) + query]), seg))
  err = float(np.abs(check - store.query(docs, query).logits).max())
  return {"documents": num_docs, "doc_len": doc_len, "query_len": query_len,
          "full_prefill_seconds": full, "swap_one_seconds": swap, "speedup": full / swap,
          "max_abs_logit_difference": err}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default="experiments/out/kv_reuse.json")
  args = parser.parse_args()
  repeats = 1 if args.quick else args.repeats
  mesh = sharding.make_mesh(1, 1, 1)
  prompt_lens = (256, 512) if args.quick else (256, 512, 1024, 2048, 4096)
  print(f"model: {CFG.num_params() / 1e6:.1f}M parameters, {jax.default_backend()}, "
        f"{os.cpu_count()} cores, jax {jax.__version__}")
  print(f"{'prompt':>6s} {'compl':>5s} {'G':>2s} {'repeated s':>10s} {'shared s':>9s} "
        f"{'speedup':>7s} {'flops':>6s} {'rep MiB':>8s} {'shared MiB':>10s} {'mem ratio':>9s}")
  rows = []
  for p in prompt_lens:
    r = update_step_row(p, 128, 8, repeats, mesh)
    rows.append(r)
    print(f"{p:6d} {128:5d} {8:2d} {r['repeated_seconds']:10.2f} {r['shared_seconds']:9.2f} "
          f"{r['speedup']:6.1f}x {r['flop_ratio']:5.1f}x "
          f"{r['repeated_peak_bytes'] / 2**20:8.0f} {r['shared_peak_bytes'] / 2**20:10.0f} "
          f"{r['memory_ratio']:8.1f}x")
  docs = doc_store_row(4, 128, 32, repeats) if args.quick else doc_store_row(16, 512, 64, repeats)
  print(f"\ndocument store: {docs['documents']} documents of {docs['doc_len']} tokens, query "
        f"{docs['query_len']} tokens: full prefill {docs['full_prefill_seconds']:.3f}s, swap one "
        f"and query {docs['swap_one_seconds']:.3f}s (max |logit difference| "
        f"{docs['max_abs_logit_difference']:.1e})")
  main_row = next((r for r in rows if r["prompt"] == 2048), rows[-1])
  print(f"speedup shared-prefix P={main_row['prompt']} C=128 G=8: {main_row['speedup']:.1f}x")
  print(f"speedup doc-store swap N={docs['documents']}: {docs['speedup']:.1f}x")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump({"update_step": rows, "document_store": docs, "params": CFG.num_params(),
               "jax": jax.__version__}, f, indent=2)


if __name__ == "__main__":
  main()
