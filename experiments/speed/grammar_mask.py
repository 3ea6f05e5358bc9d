"""What a grammar's token mask costs an engine step: constrained rows against free ones.

    python -m experiments.speed.grammar_mask [--rows 16] [--tokens 48] [--repeats 5]

The 10M-parameter Qwen2-style model of experiments/speed/engine_rollouts.py (random weights,
float32) with a byte-level vocabulary widened to 4,096 ids, `--rows` rows decoding
`--tokens` tokens each, side by side in one run, alternating: every row free, and every
row under a JSON schema (rlcode.engine.grammar: llguidance computes each row's bitmask on
the host between steps, the device unpacks it and masks the logits). A row whose object
is complete ends early, so both arms are timed per decode step (the engine's `steps`
counter), not per request. Prints seconds per step for both, their ratio, and one mask
fill on the host (timed apart); writes results/speed/grammar_mask.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from flax import nnx

from experiments.lib import results
from experiments.speed.engine_rollouts import CFG
from rlcode.engine import Engine, Request
from rlcode.engine import grammar as grammar_lib
from rlcode.engine.grammar import Grammar
from rlcode.models import Decoder
from rlcode.models.tokenizer import load_tokenizer

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "n", "ok", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "n": {"type": "integer", "minimum": 0, "maximum": 10 ** 6},
                         "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]},
                                  "maxItems": 8}}}


def timed(engine, requests):
  before = dict(engine.stats)
  start = time.perf_counter()
  res = engine.generate(requests)
  seconds = time.perf_counter() - start
  steps = engine.stats["steps"] - before.get("steps", 0)
  tokens = sum(len(c.tokens) for r in res for c in r.candidates)
  return seconds, steps, tokens


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=16)
  parser.add_argument("--tokens", type=int, default=48)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  tokenizer = load_tokenizer("bytes")
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  grammar = Grammar.json_schema(tokenizer, CFG.vocab_size, SCHEMA)
  engine = Engine(model, num_pages=args.rows * 8 + 1, page_size=16, max_rows=args.rows)
  prompt = tokenizer.encode("Describe the item as JSON: ")

  def requests(constrained, seed):
    return [Request(prompt, args.tokens, temperature=1.0, seed=seed, rows=[r],
                    grammar=grammar if constrained else None) for r in range(args.rows)]

  for constrained in (False, True):  # compiles every shape both arms meet
    timed(engine, requests(constrained, 0))
  per_step = {False: [], True: []}
  for rep in range(args.repeats):
    for constrained in ((False, True) if rep % 2 else (True, False)):
      seconds, steps, _ = timed(engine, requests(constrained, rep + 1))
      per_step[constrained].append(seconds / steps)
  # The host's part: one mask fill per row per step, timed apart on fresh matchers.
  row = np.zeros(grammar_lib.words(CFG.vocab_size), np.int32)
  matchers = [grammar.matcher() for _ in range(args.rows)]
  start = time.perf_counter()
  for m in matchers:
    m.fill(row)
  fill = (time.perf_counter() - start) / args.rows
  free, masked = (statistics.median(per_step[c]) for c in (False, True))
  print(f"{args.rows} rows, vocabulary {CFG.vocab_size}, {args.repeats} repeats (median)")
  print("| rows | free s/step | constrained s/step | ratio | one mask fill (host) |")
  print("|---:|---:|---:|---:|---:|")
  print(f"| {args.rows} | {free * 1e3:.2f} ms | {masked * 1e3:.2f} ms | {masked / free:.2f}x | "
        f"{fill * 1e6:.0f} us |")
  print("wrote", results.write("speed", "grammar_mask", {
      "rows": args.rows, "vocab_size": CFG.vocab_size, "free_s_per_step": free,
      "constrained_s_per_step": masked, "ratio": masked / free, "mask_fill_s": fill,
      "per_step": {str(k): v for k, v in per_step.items()}, "schema": SCHEMA}))


if __name__ == "__main__":
  main()
