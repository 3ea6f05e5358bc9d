"""Section reward (GRPO) against next-token cross-entropy at equal wall-clock, held-out sections.

    python experiments/section_vs_token.py [--out DIR] [--config.a.b=v ...]

(--out defaults to experiments/out/section_vs_token; ~15 min on 2 shared CPU cores.)

Two policies start from the same supervised warm start of
configs/section_prediction.py (the byte-level tiny decoder on the embedded
section corpus) and get the same compute, then generate the held-out sections:

- "grpo": `rlcode.train.train` on the config unchanged (workdir aside): the warm
  start, then config.train.steps GRPO steps rewarded by semantic similarity.
- "cross_entropy": the same warm start again (same seed and data order, so the
  same parameters: checked, its held-out evaluation must equal the GRPO run's
  step-0 evaluation exactly), then supervised steps on the same training text
  (prompt -> reference section + EOS, config.warmstart.batch_size rows, AdamW
  at the GRPO arm's peak learning rate and warmup, no decay) for as long as the
  GRPO arm trained.

"Same compute" is equal wall-clock of the training after the warm start, both
arms in this one process on the same machine, compilation included: the GRPO
arm's time is the sum over its steps of sampling, reward and update seconds
(train.py's rollout_seconds, reward_seconds, update_seconds); the cross-entropy
arm runs steps (batch layout + jitted step) until its own total reaches that.
The token positions each arm pushed through forward+backward are reported too
(GRPO's are fewer: most of its time goes to sampling and to the reward's
encoder).

Evaluation: all test-split tasks (documents held out by hash), through
`rlcode.evaluate.held_out_eval`: the config's sampled evaluation (eval.num_samples
samples at eval.temperature) and greedy decoding (1 sample, temperature 0).
Reported: semantic similarity (the reward: max(0, cosine) of MiniLM
embeddings), chrF (sacrebleu, 0-100) and the fraction of empty completions,
for the warm start alone and for each arm. Extra --config.a.b=v arguments
override the config for both arms.

Prints a table; writes section_vs_token.json and section_vs_token.png under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
from flax import nnx  # noqa: E402

from rlcode import config_lib, evaluate, grpo, rollout, sft, sharding, train  # noqa: E402
from rlcode.data import sources  # noqa: E402
from rlcode.metrics import MetricsWriter, read_metrics  # noqa: E402
from rlcode.models.build import build_model  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "section_prediction.py")
GREEDY = ["--config.eval.temperature=0.0", "--config.eval.num_samples=1"]
KEYS = {"cosine": "semantic/cosine", "chrf": "semantic/lexical",
        "empty": "semantic/empty_fraction"}


def summary(result: dict, prefix: str = "") -> dict:
  """cosine, chrF (0-100) and empty fraction of an evaluation result."""
  out = {name: float(result[prefix + key]) for name, key in KEYS.items()}
  out["chrf"] *= 100.0
  return out


def grpo_arm(config, overrides: list[str]) -> dict:
  start = time.perf_counter()
  rows = train.train(config)
  wall = time.perf_counter() - start
  steps = [r for r in rows if "loss" in r]
  evals = {r["step"]: r for r in rows if "eval/reward_mean" in r}
  greedy = config_lib.load_config(CONFIG, overrides + GREEDY)
  greedy_eval = evaluate.evaluate_checkpoint(greedy, config.workdir)
  first, last = min(evals), max(evals)
  return {
      "train_seconds": sum(r["rollout_seconds"] + r["reward_seconds"] + r["update_seconds"]
                           for r in steps),
      "run_seconds": wall,
      "steps": len(steps),
      "fwd_bwd_positions": int(round(sum(r["update_tokens_per_s"] * r["update_seconds"]
                                         for r in steps))),
      "sampled_tokens": int(round(sum(r["rollout_tokens_per_s"] * r["rollout_seconds"]
                                      for r in steps))),
      "warm_start_sampled_eval": {k.removeprefix("eval/"): v for k, v in evals[first].items()},
      "sampled": summary(evals[last], "eval/"),
      "greedy": summary(greedy_eval),
      "curve": {k: [r.get(k) for r in steps] for k in (
          "reward_mean", "reward/semantic/group_std", "reward/semantic/cosine_lexical_corr",
          "reward/semantic/lexical", "completion_len")},
      "sft_loss_last": read_metrics(config.workdir)[0]["sft_loss_last"],
  }


def cross_entropy_arm(config, overrides: list[str], budget_s: float, workdir: str) -> dict:
  greedy = config_lib.load_config(CONFIG, overrides + GREEDY)
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer = build_model(config.model, mesh, config.seed)
  graphdef, params = nnx.split(model, nnx.Param)
  policy = lambda p: nnx.merge(graphdef, p)
  train_tasks = sources.load(config.data, config.data.train_split)
  eval_tasks = sources.load(config.data, config.data.eval_split)
  if config.data.max_eval_tasks:
    eval_tasks = eval_tasks[:config.data.max_eval_tasks]
  metrics = MetricsWriter(workdir, tensorboard=False)
  params = train.warm_start(config, graphdef, params, train_tasks, tokenizer, mesh, metrics)
  metrics.close()
  start_sampled = evaluate.held_out_eval(config, policy(params), tokenizer, eval_tasks, mesh)
  start_greedy = evaluate.held_out_eval(greedy, policy(params), tokenizer, eval_tasks, mesh)

  opt_cfg = dataclasses.replace(grpo.OptimizerConfig.from_config(config.optimizer),
                                end_lr_fraction=1.0)
  optimizer = grpo.make_optimizer(opt_cfg)
  state = grpo.init_state(policy(params), optimizer, mesh)
  stream = rollout.TaskStream(train_tasks, config.warmstart.batch_size, config.seed + 2)
  step_fn, spent, steps, positions, targets, losses = None, 0.0, 0, 0, 0, []
  while spent < budget_s:
    start = time.perf_counter()
    batch = rollout.sft_batch(tokenizer, stream.next())
    if step_fn is None:
      step_fn = sft.make_sft_step(graphdef, optimizer, mesh, state, batch)
    state, m = step_fn(state, batch)
    losses.append(float(jax.device_get(m["sft_loss"])))
    spent += time.perf_counter() - start
    steps += 1
    positions += batch.tokens.shape[0] * (batch.tokens.shape[1] - 1)
    targets += int(batch.mask.sum())
  end_sampled = evaluate.held_out_eval(config, policy(state.params), tokenizer, eval_tasks, mesh)
  end_greedy = evaluate.held_out_eval(greedy, policy(state.params), tokenizer, eval_tasks, mesh)
  return {
      "train_seconds": spent, "steps": steps, "fwd_bwd_positions": positions,
      "target_tokens": targets, "loss_first": losses[0], "loss_last": losses[-1],
      "warm_start_sampled_eval": start_sampled,
      "warm_start": {"sampled": summary(start_sampled), "greedy": summary(start_greedy)},
      "sampled": summary(end_sampled), "greedy": summary(end_greedy),
      "n_eval_tasks": len(eval_tasks),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments/out/section_vs_token"))
  args, overrides = parser.parse_known_args()
  os.makedirs(args.out, exist_ok=True)
  overrides = [*overrides, "--config.train.progress_bar=false"]
  config = config_lib.load_config(
      CONFIG, overrides + [f"--config.workdir={os.path.join(args.out, 'grpo')}"])
  if os.path.exists(os.path.join(config.workdir, "checkpoints")):
    raise FileExistsError(f"{config.workdir} holds a previous run; remove it or pass another --out")

  g = grpo_arm(config, overrides)
  c = cross_entropy_arm(config, overrides, g["train_seconds"],
                        os.path.join(args.out, "cross_entropy"))
  same_start = all(c["warm_start_sampled_eval"][k] == g["warm_start_sampled_eval"][k]
                   for k in c["warm_start_sampled_eval"])
  if not same_start:
    raise AssertionError("the two arms' warm starts differ: held-out evaluations "
                         f"{c['warm_start_sampled_eval']} vs {g['warm_start_sampled_eval']}")

  rows = [("warm start only", 0.0, 0, 0, c["warm_start"]),
          ("grpo (semantic reward)", g["train_seconds"], g["steps"], g["fwd_bwd_positions"], g),
          ("cross-entropy", c["train_seconds"], c["steps"], c["fwd_bwd_positions"], c)]
  header = ("| policy | train s | steps | fwd+bwd positions | sampled cosine | sampled chrF "
            "| sampled empty | greedy cosine | greedy chrF | greedy empty |")
  lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for name, seconds, steps, positions, r in rows:
    s, gr = r["sampled"], r["greedy"]
    lines.append(f"| {name} | {seconds:.0f} | {steps} | {positions} | {s['cosine']:.3f} "
                 f"| {s['chrf']:.1f} | {s['empty']:.2f} | {gr['cosine']:.3f} | {gr['chrf']:.1f} "
                 f"| {gr['empty']:.2f} |")
  table = "\n".join(lines)
  print(table)
  print(f"{c['n_eval_tasks']} held-out tasks; grpo run {g['run_seconds']:.0f} s in all "
        f"(warm start, evaluation and checkpoints included)")
  with open(os.path.join(args.out, "section_vs_token.json"), "w") as f:
    json.dump({"grpo": g, "cross_entropy": c, "same_warm_start": same_start,
               "overrides": overrides, "table": table}, f, indent=2)

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
  for ax, metric, label in ((axes[0], "cosine", "semantic similarity"),
                            (axes[1], "chrf", "chrF")):
    for k, (name, *_, r) in enumerate(rows):
      values = [r["sampled"][metric], r["greedy"][metric]]
      ax.bar([x + 0.27 * (k - 1) for x in (0, 1)], values, width=0.27, label=name)
    ax.set_xticks([0, 1], ["sampled (T=1)", "greedy"])
    ax.set_title(f"held-out {label}")
    ax.grid(axis="y", alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "section_vs_token.png"), dpi=110)


if __name__ == "__main__":
  main()
