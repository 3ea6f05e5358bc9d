"""The shared-prompt GRPO update's time per unique token against the repeated layout's.

Claim: on a GPU, with Qwen2-0.5B's shapes (random bfloat16
weights), one 2048-token prompt and G=8 completions of 512 tokens, the update
step (forward, backward, AdamW) with the prompt computed once per group
(`rlcode.shared_prefix`) spends at most 1.2x the repeated layout's time per
token it processes: the repeated layout processes G*(P+C) tokens, the shared
one P + G*C unique tokens.

The step itself is experiments.lib.update_step.update_step_row (kv_reuse.py's: both
layouts, same weights and batch, best of --repeats after a compile run); this script adds
the per-token times, their ratio and each layout's model FLOP utilisation
(6 * parameters per token plus the attention of the pairs each layout
computes, forward and backward, over --peak-tflops).

    python -m experiments.speed.shared_prefix_update --out results/gpu/RUN   # GPU (gpu/check.sh)
    python -m experiments.speed.shared_prefix_update --smoke --out /tmp/smoke  # CPU

--smoke: experiments.lib.shapes.TINY, P=32, C=16, G=2. Writes shared_prefix_update.json
(and the folder's manifest.json) to --out (default
results/speed/shared_prefix_update[_smoke]).
"""

from __future__ import annotations

import argparse

from experiments.lib import results
from experiments.lib.shapes import H200_BF16_FLOPS, QWEN2_05B, TINY, environment
from experiments.lib.update_step import update_step_row
from rlcode.parallel import sharding

TARGET = 1.2


def attention_pairs(prompt: int, completion: int, group: int) -> dict:
  """Query-key pairs each layout's causal attention computes (forward)."""
  causal = lambda n: n * (n + 1) // 2
  return dict(repeated=group * causal(prompt + completion),
              shared=causal(prompt) + group * (completion * prompt + causal(completion)))


def model_flops(cfg, tokens: int, pairs: int) -> float:
  """Forward + backward FLOPs: 6 per parameter per token, 12 * H * D per attended pair."""
  return (6.0 * cfg.num_params() * tokens
          + 12.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * pairs)


def summarise(row: dict, cfg, peak_flops: float) -> dict:
  """The row with each layout's tokens, time per token, MFU, and their ratio against TARGET."""
  p, c, g = row["prompt"], row["completion"], row["group"]
  tokens = dict(repeated=g * (p + c), shared=p + g * c)
  pairs = attention_pairs(p, c, g)
  out = dict(row)
  for layout in ("repeated", "shared"):
    seconds = row[f"{layout}_seconds"]
    out[f"{layout}_tokens"] = tokens[layout]
    out[f"{layout}_us_per_token"] = seconds / tokens[layout] * 1e6
    out[f"{layout}_mfu"] = model_flops(cfg, tokens[layout], pairs[layout]) / seconds / peak_flops
  out["per_token_ratio"] = out["shared_us_per_token"] / out["repeated_us_per_token"]
  out["target"] = TARGET
  out["met"] = out["per_token_ratio"] <= TARGET
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny model, runs on a CPU")
  parser.add_argument("--prompt-len", type=int, default=2048)
  parser.add_argument("--completion-len", type=int, default=512)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--peak-tflops", type=float, default=H200_BF16_FLOPS / 1e12)
  parser.add_argument("--out", default=None,
                      help="the folder to write to (default results/speed/shared_prefix_update)")
  args = parser.parse_args(argv)
  if args.smoke:
    cfg, p, c, g, repeats = TINY, 32, 16, 2, 1
  else:
    cfg, p, c, g, repeats = (QWEN2_05B, args.prompt_len, args.completion_len, args.group,
                             args.repeats)
  row = update_step_row(p, c, g, repeats, sharding.make_mesh(1, 1, 1), cfg=cfg)
  row = summarise(row, cfg, args.peak_tflops * 1e12)
  results.write("speed", "shared_prefix_update" + ("_smoke" if args.smoke else ""),
                dict(environment=environment(), params=cfg.num_params(),
                     peak_tflops=args.peak_tflops, rows=[row]),
                into=args.out, filename="shared_prefix_update.json")
  print("| P | C | G | repeated s | shared s | repeated us/token | shared us/token | ratio | "
        "repeated MFU | shared MFU |")
  print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  print(f"| {p} | {c} | {g} | {row['repeated_seconds']:.3f} | {row['shared_seconds']:.3f} | "
        f"{row['repeated_us_per_token']:.2f} | {row['shared_us_per_token']:.2f} | "
        f"{row['per_token_ratio']:.2f}x | {row['repeated_mfu']:.1%} | {row['shared_mfu']:.1%} |")
  print(f"shared time per unique token within {TARGET}x of repeated: "
        f"{'met' if row['met'] else 'NOT met'}")


if __name__ == "__main__":
  main()
