"""Decode steps against the memory-bandwidth bound: bytes that must be read over HBM bandwidth.

Claim: with Qwen2-0.5B's shapes (random bfloat16 weights), batch
64, 128-token prompts and 256 new tokens, greedy, a decode step of
`rlcode.sampling.generate` takes at most 2.5x the step's bound: every weight
read once (the tied embedding is the logits' matrix) plus every row's live
keys and values, over the HBM bandwidth (--hbm-gbps, an H200's 4800 by
default).

Measured (experiments.lib.decode_step, which decode_profile.py shares): `generate` end to end (best of --repeats after a compile run),
minus the prefill (the prompts' forward alone, timed the same way), over the
new tokens after the first (which comes from the prefill). The bound averages
the live KV over the decode steps.

    python -m experiments.gpu.decode_roofline --out results/gpu/RUN   # GPU (gpu/check.sh)
    python -m experiments.gpu.decode_roofline --smoke --out /tmp/smoke  # CPU, seconds

--smoke: experiments.lib.shapes.TINY, batch 2, 8-token prompts, 8 new tokens.
Writes decode_roofline.json and the folder's manifest.json to --out (default
results/gpu/decode_roofline[_smoke]).
"""

from __future__ import annotations

import argparse

from experiments.lib import results
from experiments.lib.decode_step import TARGET, measure
from experiments.lib.shapes import H200_HBM_BYTES_PER_S, QWEN2_05B, TINY, environment


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny model, runs on a CPU")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--prompt-len", type=int, default=128)
  parser.add_argument("--new-tokens", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--hbm-gbps", type=float, default=H200_HBM_BYTES_PER_S / 1e9)
  parser.add_argument("--out", default=None,
                      help="the folder to write to (default results/gpu/decode_roofline)")
  args = parser.parse_args(argv)
  if args.smoke:
    cfg, batch, prompt, new, repeats = TINY, 2, 8, 8, 1
  else:
    cfg, batch, prompt, new, repeats = (QWEN2_05B, args.batch, args.prompt_len,
                                        args.new_tokens, args.repeats)
  row = measure(cfg, batch=batch, prompt=prompt, new=new, repeats=repeats,
                hbm=args.hbm_gbps * 1e9)
  results.write("gpu", "decode_roofline" + ("_smoke" if args.smoke else ""),
                dict(environment=environment(), hbm_gbps=args.hbm_gbps, rows=[row]),
                into=args.out, filename="decode_roofline.json")
  print("| params | batch | prompt | new | step ms | bound ms | step / bound | tokens/s |")
  print("|---:|---:|---:|---:|---:|---:|---:|---:|")
  print(f"| {row['params'] / 1e6:.1f}M | {batch} | {prompt} | {new} | {row['step_ms']:.3f} | "
        f"{row['bound_ms']:.3f} | {row['ratio_to_bound']:.2f}x | {row['tokens_per_s']:.0f} |")
  print(f"decode step within {TARGET}x of the bandwidth bound: "
        f"{'met' if row['met'] else 'NOT met'}")


if __name__ == "__main__":
  main()
