"""KV reuse, measured: the shared-prompt GRPO update and the document KV store.

1. One GRPO update step (forward, backward, AdamW) on G = 8 completions of one
   prompt, with the prompt computed once per group (rlcode.shared_prefix) versus
   repeated in every row (the standard layout), same model (~14M parameters),
   same batch, side by side, for prompt lengths 256 ... 4096 and 128-token
   completions. Both layouts run the output layer at completion positions only
   (the repeated layout's window, like TRL's logits_to_keep), so the comparison
   is against a baseline that skips the work it does not need. The FLOP ratio
   counts matmuls per position and attention work per attended pair
   (`update_step.forward_flops`). Peak memory is XLA's own account of each compiled step
   (`compiled.memory_analysis()`: arguments + outputs + temporaries).
2. A query over 16 cached documents after one of them is swapped for a new one
   (rlcode.doc_store: one document prefilled, then the query against all 16),
   versus a full prefill of the packed documents and query (whose output layer
   also runs at the query's positions only).

    python -m experiments.speed.kv_reuse [--quick] [--out DIR]

The update step is experiments.lib.update_step (shared with shared_prefix_update.py).
Prints two tables and one grep-able summary line per target, writes result.json to
--out (default results/speed/kv_reuse, or kv_reuse_quick with --quick). Times are the
best of --repeats runs after a compile run.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.lib import results
from experiments.lib.timing import best_time
from experiments.lib.update_step import CFG, update_step_row
from rlcode.models import Decoder
from rlcode.parallel import sharding
from rlcode.sampling.doc_store import DocumentStore


def doc_store_row(num_docs, doc_len, query_len, repeats):
  """Times a query after one of `num_docs` cached documents is swapped, against a full
  prefill of the packed documents and query; returns the table row."""
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
    """Swaps one document for a fresh one and queries the store."""
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
  parser.add_argument("--out", default=None,
                      help="the result's folder (default results/speed/kv_reuse[_quick])")
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
  name = "kv_reuse_quick" if args.quick else "kv_reuse"
  print("wrote", results.write("speed", name, {
      "update_step": rows, "document_store": docs, "params": CFG.num_params(),
      "jax": jax.__version__}, into=args.out))


if __name__ == "__main__":
  main()
