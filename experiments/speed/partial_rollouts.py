"""Partial rollouts against the synchronous loop: wall-clock per GRPO step when completion
lengths are heavy-tailed.

    python -m experiments.speed.partial_rollouts [--steps 8] [--warmup 3] [--prompts 4]
        [--group 8] [--prompt 64] [--budget 256] [--median 32] [--eta 1] [--seed 0] [--pack]

The 10M-parameter model of experiments/speed/engine_rollouts.py (random weights, float32).
Each group is `--group` completions of a `--prompt`-token prompt whose lengths are
log-normal (sigma 1, median `--median`, cut at `--budget`: engine_rollouts' mix, median
1/8 of the budget; a candidate stops at its drawn length). A step takes `--prompts` groups
and runs the jitted GRPO update (rlcode.rl.grpo, the shared-prompt layout padded to the
budget: one compiled shape; with `--pack`, packed into rows of `--budget` tokens,
rlcode.rl.packing) on them, then publishes the new weights to the engine. Two
arms, the same engine sizes, groups and update, one after the other in one run:

- sync: each step samples its groups on the engine to the last row, then updates (the
  engine idles during the update, the update waits for the slowest row);
- partial: the engine runs the whole time with (eta + 1) x `--prompts` groups in flight; a
  step takes the first `--prompts` groups to finish (groups holding a token more than eta
  versions old are dropped and sampled again, as rlcode.rl.partial does) and the
  new weights reach the rows in flight between two engine steps (recomputed).

The first `--warmup` steps of each arm compile and are not timed. Prints seconds per step,
the engine's busy fraction (its step time over the timed wall clock), the trainer's wait
for groups, completion tokens trained per second and the ratio; writes
results/speed/partial_rollouts. Rewards are random (no sandbox): this measures the systems
part, rollouts and update; scoring runs on the trainer's thread in both loops.
"""

from __future__ import annotations

import argparse
import collections
import threading
import time

import jax
import numpy as np
from flax import nnx

from experiments.lib import results
from experiments.speed.engine_rollouts import CFG, PAGE, lengths_mix
from rlcode import optim
from rlcode.engine import Engine, Request
from rlcode.models import Decoder
from rlcode.parallel import sharding
from rlcode.rl import grpo, objective, packing, shared_prefix


class Groups:
  """Group i: its prompt, its rows' lengths and seed (the same for both arms)."""

  def __init__(self, args):
    self.args, self.rng = args, np.random.default_rng(args.seed)
    self.drawn: list = []

  def __getitem__(self, i):
    while len(self.drawn) <= i:
      self.drawn.append((self.rng.integers(1, CFG.vocab_size, self.args.prompt).tolist(),
                         lengths_mix(self.rng, self.args.group, self.args.median,
                                     self.args.budget)))
    return self.drawn[i]

  def request(self, i, on_done=None):
    prompt, lengths = self[i]
    return Request(prompt, self.args.budget, n=self.args.group, temperature=1.0,
                   seed=self.args.seed, rows=[i * self.args.group + c
                                               for c in range(self.args.group)],
                   stop_check=lambda c, toks, n=lengths: len(toks) >= n[c], on_done=on_done)


class Trainer:
  """The jitted update on a step's groups, and the sampling state it publishes."""

  def __init__(self, model, args):
    self.args = args
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    self.graphdef, _ = nnx.split(model, nnx.Param)
    optimizer = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-5,
                                                           warmup_steps=1, decay_steps=100))
    # The update donates its state: the engine keeps its own copies of the weights.
    self.state = jax.tree.map(lambda x: x.copy(), optim.init_state(model, optimizer, mesh))
    rows = args.prompts * args.group
    example = (packing.PackedBatch.abstract(args.prompts, rows) if args.pack else
               shared_prefix.GroupedBatch.abstract(args.prompts, rows))
    self.update = grpo.make_update_step(
        self.graphdef, optimizer, objective.LossConfig(max_completion_len=args.budget), mesh,
        self.state, example, logprob_fn=(packing.logprob_fn(1.0) if args.pack
                                         else shared_prefix.logprob_fn(1.0)))
    self.rng = np.random.default_rng(args.seed + 1)

  def step(self, groups) -> tuple[int, object]:
    """(completion tokens trained, the new sampling state)."""
    cands = [c for _, result in groups for c in result.candidates]
    common = dict(pad_id=0, completion_len=self.args.budget,
                  old_logp=[c.logprobs for c in cands],
                  adv=self.rng.normal(size=len(cands)).astype(np.float32))
    prompts, completions = [prompt for prompt, _ in groups], [c.tokens for c in cands]
    batch = (packing.packed_batch(prompts, completions, pack_tokens=self.args.budget,
                                  min_packs=self.args.group // 2, **common) if self.args.pack
             else shared_prefix.grouped_batch(prompts, completions, **common))
    self.state, metrics = self.update(self.state, batch)
    jax.block_until_ready(metrics["loss"])
    model = nnx.merge(self.graphdef, self.state.params)
    weights = jax.tree.map(lambda x: x.copy(), nnx.state(model.for_sampling()))
    return sum(len(c.tokens) for c in cands), weights


def run_sync(model, args, groups: Groups) -> dict:
  trainer = Trainer(model, args)
  engine = Engine(model, **sizes(args, args.prompts))
  rows, next_group = [], 0
  for step in range(args.warmup + args.steps):
    t0 = time.perf_counter()
    reqs = [groups.request(next_group + i) for i in range(args.prompts)]
    res = engine.generate(reqs)
    sampled = time.perf_counter()
    tokens, weights = trainer.step([(r.prompt, x) for r, x in zip(reqs, res)])
    engine.publish(weights, step + 1)
    next_group += args.prompts
    # generate() steps the engine on this thread: it is busy exactly while sampling.
    rows.append({"seconds": time.perf_counter() - t0, "tokens": tokens,
                 "engine_busy": sampled - t0, "trainer_wait": sampled - t0})
  return summarise(rows[args.warmup:])


def run_partial(model, args, groups: Groups) -> dict:
  trainer = Trainer(model, args)
  in_flight = (args.eta + 1) * args.prompts
  engine = Engine(model, **sizes(args, in_flight)).start()
  cond, ready = threading.Condition(), collections.deque()
  state = {"submitted": 0, "load": 0, "dropped": 0}

  def done(i, result):
    with cond:
      state["load"] -= 1
      ready.append((i, result))
      top_up()
      cond.notify_all()

  def top_up():
    while state["load"] + len(ready) < in_flight:
      i = state["submitted"]
      state["submitted"] += 1
      state["load"] += 1
      engine.submit(groups.request(i, on_done=lambda r, i=i: done(i, r)))

  with cond:
    top_up()
  rows = []
  try:
    for step in range(args.warmup + args.steps):
      t0 = time.perf_counter()
      busy0 = engine.stats["busy_seconds"]
      taken = []
      with cond:
        while len(taken) < args.prompts:
          cond.wait_for(lambda: ready)
          i, result = ready.popleft()
          if result.error is not None:
            raise result.error
          if min(min(c.versions) for c in result.candidates) < step - args.eta:
            state["dropped"] += 1  # too stale: sampled again, as rlcode.rl.partial does
            continue
          taken.append((groups[i][0], result))
        top_up()
      sampled = time.perf_counter()
      tokens, weights = trainer.step(taken)
      engine.publish(weights, step + 1)
      rows.append({"seconds": time.perf_counter() - t0, "tokens": tokens,
                   "engine_busy": engine.stats["busy_seconds"] - busy0,
                   "trainer_wait": sampled - t0})
  finally:
    engine.stop(cancel=True)
  return {**summarise(rows[args.warmup:]), "dropped_groups": state["dropped"]}


def sizes(args, groups_at_once: int) -> dict:
  per_row = -(-(args.prompt + args.budget) // PAGE)
  return dict(num_pages=1 + groups_at_once * args.group * per_row, page_size=PAGE,
              max_rows=groups_at_once * args.group, prefix_cache=False)


def summarise(rows) -> dict:
  wall = sum(r["seconds"] for r in rows)
  return {"seconds_per_step": wall / len(rows),
          "engine_busy_fraction": sum(r["engine_busy"] for r in rows) / wall,
          "trainer_wait_fraction": sum(r["trainer_wait"] for r in rows) / wall,
          "tokens_per_s": sum(r["tokens"] for r in rows) / wall, "steps": rows}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  for name, default in (("steps", 8), ("warmup", 3), ("prompts", 4), ("group", 8),
                        ("prompt", 64), ("budget", 256), ("median", 32), ("eta", 1),
                        ("seed", 0)):
    parser.add_argument(f"--{name}", type=int, default=default)
  parser.add_argument("--pack", action="store_true",
                      help="the update packs each group's completions (rlcode.rl.packing, "
                           "packs of --budget tokens, at least group/2 a group: few shapes)")
  args = parser.parse_args()
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  groups = Groups(args)
  arms = {"sync": run_sync(model, args, groups), "partial": run_partial(model, args, groups)}
  ratio = arms["sync"]["seconds_per_step"] / arms["partial"]["seconds_per_step"]
  print(f"{args.prompts} groups x {args.group} a step, prompt {args.prompt}, lengths "
        f"log-normal median {args.median} cut at {args.budget}; eta {args.eta}; "
        f"{args.steps} timed steps after {args.warmup}")
  print("| loop | seconds a step | engine busy | trainer waiting | trained tokens/s |")
  print("|---|---:|---:|---:|---:|")
  for name, a in arms.items():
    print(f"| {name} | {a['seconds_per_step']:.2f} | {a['engine_busy_fraction']:.0%} | "
          f"{a['trainer_wait_fraction']:.0%} | {a['tokens_per_s']:.0f} |")
  print(f"partial / sync: {ratio:.2f}x faster a step (groups dropped as stale: "
        f"{arms['partial']['dropped_groups']})")
  print("wrote", results.write("speed", "partial_rollouts", {
      "args": vars(args), "arms": arms, "speedup": ratio}))


if __name__ == "__main__":
  main()
