"""Decode steps against the memory-bandwidth bound: bytes that must be read over HBM bandwidth.

Claim (issue 17): with Qwen2-0.5B's shapes (random bfloat16 weights), batch
64, 128-token prompts and 256 new tokens, greedy, a decode step of
`rlcode.sampling.generate` takes at most 2.5x the step's bound: every weight
read once (the tied embedding is the logits' matrix) plus every row's live
keys and values, over the HBM bandwidth (--hbm-gbps, an H200's 4800 by
default).

Measured: `generate` end to end (best of --repeats after a compile run),
minus the prefill (the prompts' forward alone, timed the same way), over the
new tokens after the first (which comes from the prefill). The bound averages
the live KV over the decode steps.

    python experiments/decode_roofline.py --out experiments/gpu_h200      # GPU
    python experiments/decode_roofline.py --smoke --out /tmp/smoke         # CPU, seconds

--smoke: experiments.gpu_common.TINY, batch 2, 8-token prompts, 8 new tokens.
Writes decode_roofline.json under --out.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.gpu_common import (H200_HBM_BYTES_PER_S, QWEN2_05B, TINY,  # noqa: E402
                                    environment, write_json)
from experiments.kv_reuse import best_time  # noqa: E402
from rlcode.models import Decoder  # noqa: E402
from rlcode.sampling import generate  # noqa: E402

TARGET = 2.5


def step_bytes(cfg, batch: int, prompt: int, new: int) -> dict:
  """Bytes a decode step must read, averaged over the new-1 decode steps."""
  itemsize = jnp.dtype(cfg.jnp_dtype).itemsize
  weights = cfg.num_params() * jnp.dtype(cfg.jnp_param_dtype).itemsize
  per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize
  # Decode step i (1..new-1) attends over prompt + i keys per row.
  live = np.mean([prompt + i for i in range(1, new)]) if new > 1 else prompt
  return dict(weights=int(weights), kv=int(batch * live * per_token))


def workload(cfg, *, batch: int, prompt: int, new: int):
  """(prefill, gen): thunks running the prompts' forward alone (jitted) and a greedy
  `generate` of `new` tokens, on a random-weight `cfg` model and random prompts."""
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  prompts = rng.integers(1, cfg.vocab_size, (batch, prompt))
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, tokens):
    m = nnx.merge(graphdef, state)
    h, _ = m.hidden(tokens)
    return m.logits(h[:, -1:])

  tokens = jnp.asarray(prompts, jnp.int32)
  prefill = lambda: forward(state, tokens)
  gen = lambda: generate(model, prompts.tolist(), max_new_tokens=new, temperature=0.0).tokens
  return prefill, gen


def measure(cfg, *, batch: int, prompt: int, new: int, repeats: int, hbm: float,
            work=None) -> dict:
  """The step against its bound; `work`: a `workload(...)` pair to time (default: a new one)."""
  prefill, gen = work or workload(cfg, batch=batch, prompt=prompt, new=new)
  prefill_s = best_time(prefill, repeats)
  total_s = best_time(gen, repeats)
  step_s = (total_s - prefill_s) / max(new - 1, 1)
  need = step_bytes(cfg, batch, prompt, new)
  bound_s = (need["weights"] + need["kv"]) / hbm
  return dict(batch=batch, prompt=prompt, new_tokens=new, params=cfg.num_params(),
              generate_s=total_s, prefill_s=prefill_s, step_ms=step_s * 1e3,
              bytes_per_step=need, bound_ms=bound_s * 1e3, ratio_to_bound=step_s / bound_s,
              target=TARGET, met=0 < step_s / bound_s <= TARGET,
              tokens_per_s=batch * new / total_s)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny model, runs on a CPU")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--prompt-len", type=int, default=128)
  parser.add_argument("--new-tokens", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--hbm-gbps", type=float, default=H200_HBM_BYTES_PER_S / 1e9)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    "out"))
  args = parser.parse_args(argv)
  if args.smoke:
    cfg, batch, prompt, new, repeats = TINY, 2, 8, 8, 1
  else:
    cfg, batch, prompt, new, repeats = (QWEN2_05B, args.batch, args.prompt_len,
                                        args.new_tokens, args.repeats)
  row = measure(cfg, batch=batch, prompt=prompt, new=new, repeats=repeats,
                hbm=args.hbm_gbps * 1e9)
  write_json(dict(environment=environment(), hbm_gbps=args.hbm_gbps, rows=[row]),
             os.path.join(args.out, "decode_roofline.json"))
  print("| params | batch | prompt | new | step ms | bound ms | step / bound | tokens/s |")
  print("|---:|---:|---:|---:|---:|---:|---:|---:|")
  print(f"| {row['params'] / 1e6:.1f}M | {batch} | {prompt} | {new} | {row['step_ms']:.3f} | "
        f"{row['bound_ms']:.3f} | {row['ratio_to_bound']:.2f}x | {row['tokens_per_s']:.0f} |")
  print(f"decode step within {TARGET}x of the bandwidth bound: "
        f"{'met' if row['met'] else 'NOT met'}")


if __name__ == "__main__":
  main()
