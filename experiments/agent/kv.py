"""KV kept across turns vs the whole context re-prefilled every turn.

Setup: 10-turn episodes whose context grows to ~4k tokens: a 200-token prompt, then
per turn 24 sampled tokens and a 360-token observation. One task, G = 4 episodes
run together (their prompt prefilled once in both modes). The policy is a
random decoder (~3.0M parameters, 4 layers, width 256, head dim 64, context 4096,
the tool-calling byte tokenizer) and the environment answers every turn with a
fixed-length observation, so both modes sample exactly the same tokens (checked)
and the times measure the sampler alone: rlcode.agent.sampler.run_episodes on the engine
with reuse_kv=True (each episode's pages found in the prefix cache, only the new tokens
prefilled) against reuse_kv=False (every episode's whole context prefilled from scratch
every turn, what a server without a prefix cache does). Each mode runs once to compile, then `--repeats`
timed runs of each, alternating; the table shows the median.

    python -m experiments.agent.kv [--repeats 3] [--name agent_kv]

The stand-in environment is experiments.lib.standins.FixedEnv. Prints the table, the
load average and one grep-able line `speedup kv-kept 10 turns: Nx`; writes
results/agent/NAME.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
from flax import nnx

from experiments.lib import results
from experiments.lib.standins import (GROUP, OBS_TOKENS, PROMPT_TOKENS, TURN_TOKENS, TURNS,
                                      FixedEnv)
from rlcode.agent import sampler
from rlcode.agent.chat import ChatFormat
from rlcode.data.tasks import Task
from rlcode.models import Decoder, ModelConfig
from rlcode.models.tokenizer import load_tokenizer

CFG = ModelConfig(vocab_size=264, hidden_size=256, intermediate_size=704, num_layers=4,
                  num_heads=4, num_kv_heads=2, head_dim=64, qkv_bias=True,
                  tie_embeddings=True, max_seq_len=4096)


def run(model, chat, reuse_kv):
  """One timed run of GROUP episodes: (seconds, the sampler's timing, the trajectories)."""
  budgets = sampler.Budgets(max_total_tokens=4096, max_turn_tokens=TURN_TOKENS,
                            max_observation_tokens=OBS_TOKENS)
  task = Task(id="kv", prompt="p" * (PROMPT_TOKENS - 20))
  timing = sampler.Timing()
  start = time.perf_counter()
  trajs = sampler.run_episodes(model, chat, [FixedEnv() for _ in range(GROUP)], [task],
                               group_size=GROUP, budgets=budgets, temperature=1.0, seed=0,
                               reuse_kv=reuse_kv, timing=timing)
  return time.perf_counter() - start, timing, trajs


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--name", default="agent_kv", help="the result's name under results/agent/")
  args = parser.parse_args()
  chat = ChatFormat("compact", load_tokenizer("bytes+tools"))
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  timings, tokens = {True: [], False: []}, {}
  load_before = os.getloadavg()
  for reuse in (True, False):
    _, _, trajs = run(model, chat, reuse)  # compiles every shape this mode meets
    tokens[reuse] = [t.tokens for t in trajs]
  for _ in range(args.repeats):  # alternating, so that both modes see the same load
    for reuse in (True, False):
      timings[reuse].append(run(model, chat, reuse))
  load_after = os.getloadavg()
  if tokens[True] != tokens[False]:
    raise SystemExit("the two modes sampled different tokens")
  context = max(len(t) for t in tokens[True]) + PROMPT_TOKENS
  print(f"{GROUP} episodes of {TURNS} turns, context {context} tokens, "
        f"{params / 1e6:.1f}M-parameter policy, CPU; median of {args.repeats}")
  print("| mode | seconds per episode | engine s | prefilled tokens | cached tokens |")
  print("|---|---:|---:|---:|---:|")
  row = {}
  for reuse, name in ((True, "KV kept"), (False, "re-prefilled each turn")):
    runs = timings[reuse]
    total = statistics.median(r[0] for r in runs) / GROUP
    med = lambda f: statistics.median(getattr(r[1], f) for r in runs) / GROUP
    row[name] = {"seconds_per_episode": total, "sample": med("sample"),
                 "prefill_tokens": med("prefill_tokens"), "cached_tokens": med("cached_tokens")}
    print(f"| {name} | {total:.2f} | {med('sample'):.2f} | {med('prefill_tokens'):.0f} | "
          f"{med('cached_tokens'):.0f} |")
  speedup = (row["re-prefilled each turn"]["seconds_per_episode"]
             / row["KV kept"]["seconds_per_episode"])
  print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f}")
  print(f"speedup kv-kept {TURNS} turns: {speedup:.1f}x")
  print("wrote", results.write("agent", args.name, {
      "rows": row, "speedup": speedup, "context_tokens": context,
      "load": [load_before, load_after], "repeats": args.repeats}))


if __name__ == "__main__":
  main()
