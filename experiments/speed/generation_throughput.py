"""Decode throughput of rlcode's compiled sampler versus transformers' `generate`.

One Qwen2-style model of about 10M parameters (random weights), batch 16,
prompts of 32 tokens, 128 new tokens, greedy, no stop token, on CPU. Both
sides run the same weights: rlcode saves them in Hugging Face format and
transformers loads that directory. Greedy tokens must agree (a correctness check
on the comparison). Each side is warmed up once, then timed over --repeats runs;
the best run counts.

    python -m experiments.speed.generation_throughput            # needs the `bench` extra
    make bench && .venv/bin/python -m experiments.speed.generation_throughput

Prints a table and writes result.json to --out (default
results/speed/generation_throughput).
Without torch/transformers it says so and reports rlcode alone.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import jax
import numpy as np
from flax import nnx

from experiments.lib import results
from experiments.lib.timing import best_of
from rlcode.models import Decoder, ModelConfig, save_hf
from rlcode.sampling import generate

CFG = ModelConfig(vocab_size=4096, hidden_size=256, intermediate_size=704, num_layers=12,
                  num_heads=8, num_kv_heads=2, head_dim=32, qkv_bias=True,
                  tie_embeddings=False, max_seq_len=512, rope_theta=10000.0)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--prompt-len", type=int, default=32)
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=None,
                      help="the result's folder (default results/speed/generation_throughput)")
  args = parser.parse_args()

  model = Decoder(CFG, rngs=nnx.Rngs(0))
  prompts = np.random.default_rng(0).integers(0, CFG.vocab_size, (args.batch, args.prompt_len))
  n_tokens = args.batch * args.new_tokens
  run = lambda: generate(model, prompts.tolist(), max_new_tokens=args.new_tokens,
                         temperature=0.0)
  run()
  ours_s, ours = best_of(run, args.repeats)
  rows = [{"impl": f"rlcode (jax {jax.__version__})", "seconds": ours_s,
           "tokens_per_s": n_tokens / ours_s}]

  peer = None
  try:
    import torch
    import transformers
  except ImportError:
    print("torch/transformers not installed (pip install -e '.[bench]'): "
          "reporting rlcode alone")
  else:
    torch.set_num_threads(os.cpu_count())
    with tempfile.TemporaryDirectory() as tmp:
      save_hf(model, tmp)
      hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    hf_model.eval()
    inputs = torch.as_tensor(prompts)

    def hf_run():
      with torch.inference_mode():
        return hf_model.generate(inputs, attention_mask=torch.ones_like(inputs),
                                 max_new_tokens=args.new_tokens,
                                 min_new_tokens=args.new_tokens, do_sample=False,
                                 pad_token_id=0, eos_token_id=None)
    hf_run()
    hf_s, hf_out = best_of(hf_run, args.repeats)
    hf_tokens = hf_out[:, args.prompt_len:].numpy()
    agree = float(np.mean(hf_tokens == ours.tokens))
    peer = {"impl": f"transformers {transformers.__version__} (torch {torch.__version__})",
            "seconds": hf_s, "tokens_per_s": n_tokens / hf_s, "greedy_token_agreement": agree}
    rows.append(peer)

  print(f"model: {CFG.num_params() / 1e6:.1f}M params, batch {args.batch}, prompt "
        f"{args.prompt_len}, {args.new_tokens} new tokens, greedy, {os.cpu_count()} CPU cores")
  print(f"{'implementation':48s} {'seconds':>8s} {'tokens/s':>10s}")
  for r in rows:
    print(f"{r['impl']:48s} {r['seconds']:8.3f} {r['tokens_per_s']:10.0f}")
  result = {"config": vars(args), "params": CFG.num_params(), "rows": rows}
  if peer is not None:
    ratio = rows[0]["tokens_per_s"] / peer["tokens_per_s"]
    result["speedup_vs_transformers"] = ratio
    print(f"greedy token agreement with transformers: {peer['greedy_token_agreement']:.3f}")
    print(f"speedup rlcode/transformers: {ratio:.2f}x")
  print("wrote", results.write("speed", "generation_throughput", result, into=args.out))


if __name__ == "__main__":
  main()
