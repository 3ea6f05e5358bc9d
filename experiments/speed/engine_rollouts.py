"""The inference engine against the static sampler: rollouts, shared prefixes, agent turns.

    python -m experiments.speed.engine_rollouts [--quick] [--out DIR]

One Qwen2-style model of about 10M parameters (random weights, float32) on this machine,
side by side in one run:

1. Rollouts of a heavy-tailed length mix: 16 prompts of 64 tokens, 8 completions each,
   completion lengths log-normal (median 128, sigma 1, capped at the 1,024-token budget:
   a few rows run to the budget, most stop early). The static sampler
   (`rlcode.sampling.static_generate`, a while loop over a whole batch) runs 2 groups at a time
   (16 rows), every row's cache allocated for the budget; each batch runs until its
   longest row ends (its `max_new_tokens` is that row's length, the most favourable
   budget it could be given; compiles are excluded by running each batch twice). The
   engine gets the same KV memory as a page pool (the static batch's cache bytes), all 16
   groups at once, up to 64 rows decoding. Both sample the same rows with the same keys:
   tokens per second of the completions' tokens, and the tokens must be equal. While the
   engine runs, the pool's bytes per live token against the live tokens' own KV bytes.
2. Time to first token with a shared 512-token system prompt: 16 requests one after
   another (system prompt + 16 tokens of their own), with and without the prefix cache.
3. Agent turns, as experiments/agent/kv.py measures the agent sampler: 4 episodes at
   once of 10 turns, each turn sampling 24 tokens and appending a 360-token observation
   (context about 3,700 tokens); the engine with the prefix cache (each episode's earlier
   turns found in it) against without it (every turn re-prefilled).

Writes result.json to --out (default results/speed/engine_rollouts).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from flax import nnx

from experiments.lib import results
from rlcode.engine import Engine, Request
from rlcode.models import Decoder, ModelConfig
from rlcode.sampling import static_generate

CFG = ModelConfig(vocab_size=4096, hidden_size=256, intermediate_size=704, num_layers=12,
                  num_heads=8, num_kv_heads=2, head_dim=32, qkv_bias=True,
                  tie_embeddings=False, max_seq_len=4096, rope_theta=10000.0)
PAGE = 16


def lengths_mix(rng, rows, median, budget):
  return np.clip(np.round(rng.lognormal(math.log(median), 1.0, rows)), 1, budget).astype(int)


def rollouts(model, *, prompts, group, prompt_len, budget, median, static_groups, seed=0):
  rng = np.random.default_rng(seed)
  tasks = [rng.integers(1, CFG.vocab_size, prompt_len).tolist() for _ in range(prompts)]
  lengths = lengths_mix(rng, prompts * group, median, budget).reshape(prompts, group)
  useful = int(lengths.sum())

  # The static sampler, static_groups groups a batch; each batch twice (the first compiles).
  static_tokens, seconds = [], 0.0
  for start in range(0, prompts, static_groups):
    batch = tasks[start:start + static_groups]
    longest = int(lengths[start:start + static_groups].max())
    for attempt in range(2):
      t0 = time.perf_counter()
      out = static_generate(model, batch, max_new_tokens=longest, temperature=1.0,
                     group_size=group, seed=seed, row_offset=start * group)
      if attempt:
        seconds += time.perf_counter() - t0
    want = lengths[start:start + static_groups].reshape(-1)
    static_tokens += [row[:n].tolist() for row, n in zip(out.tokens, want)]
  static_rows = static_groups * group
  kv_tokens = static_groups * prompt_len + static_rows * budget  # the static batch's cache
  pages = kv_tokens // PAGE + 1

  def requests():
    return [Request(task, budget, n=group, temperature=1.0, seed=seed,
                    rows=[i * group + g for g in range(group)],
                    stop_check=lambda c, toks, n=lengths[i]: len(toks) >= n[c])
            for i, task in enumerate(tasks)]

  warm = Engine(model, num_pages=pages, page_size=PAGE, max_rows=64, prefix_cache=False)
  warm.generate(requests())  # compiles every shape the timed run meets
  engine = Engine(model, num_pages=pages, page_size=PAGE, max_rows=64, prefix_cache=False)
  ratios = []
  step = engine.step

  def measured_step():
    step()
    live = engine.prefilling + engine.decoding
    held = engine.pool.used() * PAGE
    distinct = sum(seq.cached for seq in live) - sum(
        len(seq.group.request.prompt) // PAGE * PAGE for seq in live if seq.c > 0)
    if distinct:
      ratios.append(held / distinct)
  engine.step = measured_step
  t0 = time.perf_counter()
  res = engine.generate(requests())
  engine_seconds = time.perf_counter() - t0
  engine_tokens = [c.tokens for r in res for c in r.candidates]
  return {
      "prompts": prompts, "group": group, "prompt_len": prompt_len, "budget": budget,
      "median_len": median, "completion_tokens": useful,
      "mean_len": float(lengths.mean()), "max_len": int(lengths.max()),
      "static": {"rows_per_batch": static_rows, "seconds": seconds,
                 "tokens_per_s": useful / seconds},
      "engine": {"kv_pages": pages, "page_size": PAGE, "max_rows": 64,
                 "seconds": engine_seconds, "tokens_per_s": useful / engine_seconds,
                 "steps": engine.stats["steps"], "preemptions": engine.stats["preemptions"],
                 "pool_per_live_token": {"mean": float(np.mean(ratios)),
                                         "max": float(np.max(ratios))}},
      "speedup": seconds / engine_seconds,
      "same_tokens": engine_tokens == static_tokens,
  }


def ttft(model, *, system_len, own, requests_n, seed=0):
  rng = np.random.default_rng(seed + 1)
  out = {}
  for cached in (False, True):
    engine = Engine(model, num_pages=512, page_size=PAGE, max_rows=8, prefix_cache=cached)
    warm_system = rng.integers(1, CFG.vocab_size, system_len).tolist()
    system = rng.integers(1, CFG.vocab_size, system_len).tolist()
    for prefix in (warm_system, warm_system):  # compiles the cold and the warm shapes
      engine.generate([Request(prefix + rng.integers(1, CFG.vocab_size, own).tolist(), 1)])
    times, firsts = [], []
    for _ in range(requests_n):
      prompt = system + rng.integers(1, CFG.vocab_size, own).tolist()
      t0 = time.perf_counter()
      r = engine.generate([Request(prompt, 1, temperature=0.0)])[0]
      times.append(time.perf_counter() - t0)
      firsts.append(r.cached_tokens)
    out["cached" if cached else "uncached"] = {
        "median_s": float(np.median(times)), "cached_tokens": firsts}
  out["speedup"] = out["uncached"]["median_s"] / out["cached"]["median_s"]
  return out


def agent_turns(model, *, episodes, turns, first_len, completion, observation, seed=0):
  rng = np.random.default_rng(seed + 2)
  out = {}
  for cached in (False, True):
    engine = Engine(model, num_pages=episodes * CFG.max_seq_len // PAGE + 1, page_size=PAGE,
                    max_rows=8, prefix_cache=cached)
    seconds = []
    for attempt in range(2):  # the first round compiles
      prompts = [rng.integers(1, CFG.vocab_size, first_len).tolist() for _ in range(episodes)]
      t0 = time.perf_counter()
      for _ in range(turns):
        res = engine.generate([Request(p, completion, temperature=1.0, seed=attempt, rows=[e])
                               for e, p in enumerate(prompts)])
        prompts = [p + r.candidates[0].tokens
                   + rng.integers(1, CFG.vocab_size, observation).tolist()
                   for p, r in zip(prompts, res)]
      seconds.append(time.perf_counter() - t0)
    out["kept" if cached else "re-prefill"] = {
        "seconds_per_episode_round": seconds[1], "final_context": len(prompts[0]),
        "prefix_hit_tokens": engine.stats["prefix_hit_tokens"]}
  out["speedup"] = (out["re-prefill"]["seconds_per_episode_round"]
                    / out["kept"]["seconds_per_episode_round"])
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  results.git_state()  # the commit measured: the one at the start, not after a long run
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  if args.quick:
    sizes = dict(prompts=4, group=4, prompt_len=32, budget=128, median=16, static_groups=2)
    turn = dict(episodes=2, turns=3, first_len=64, completion=8, observation=16)
    first = dict(system_len=128, own=16, requests_n=3)
  else:
    sizes = dict(prompts=16, group=8, prompt_len=64, budget=1024, median=128, static_groups=2)
    turn = dict(episodes=4, turns=10, first_len=200, completion=24, observation=360)
    first = dict(system_len=512, own=16, requests_n=16)
  payload = {"model": {"parameters": CFG.num_params(), "layers": CFG.num_layers,
                       "hidden": CFG.hidden_size}}
  payload["rollouts"] = rollouts(model, **sizes)
  print("rollouts", payload["rollouts"], flush=True)
  payload["ttft"] = ttft(model, **first)
  print("ttft", payload["ttft"], flush=True)
  payload["agent_turns"] = agent_turns(model, **turn)
  print("agent turns", payload["agent_turns"], flush=True)
  name = "engine_rollouts_quick" if args.quick else "engine_rollouts"
  results.write("speed", name, payload, into=args.out)


if __name__ == "__main__":
  main()
