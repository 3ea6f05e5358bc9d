"""Section reward (GRPO) against next-token cross-entropy from the same warm start, held out.

    python -m experiments.sections.vs_token [--seeds 0 1 2] [--out DIR] [--name NAME]
        [--config.a.b=v ...]

(--out defaults to experiments/out/section_vs_token, --name to section_vs_token.)

For each seed, three policies start from the same supervised warm start of
configs/section_prediction.py (the tiny decoder over the code BPE tokenizer on
the embedded section corpus: pydoc topics, stdlib modules, the bundles' docs),
loaded from one warm-start cache so the parameters are the very same:

- "grpo": `rlcode.train.train` on the config (workdir, seed and the cache aside):
  config.train.steps GRPO steps rewarded by semantic similarity, evaluated on
  the validation split along the way (the split tuned on) and on the test
  split after the warm start and after the last step.
- "cross-entropy, equal compute": supervised steps on the same training text
  (prompt -> reference section + EOS; experiments.lib.runs) until they
  have pushed as many model FLOPs as the GRPO steps: a forward costs 2N per
  token and a forward+backward 6N, so the cross-entropy arm gets the GRPO
  update's trained positions plus a third of its sampled and prefilled tokens
  (the reward's sentence encoder is not counted, nor attention).
- "cross-entropy, equal wall-clock": the same supervised run continued until it
  has trained as long as the GRPO steps took (sampling, reward and update
  seconds): the control that simply trains the warm start longer.

Evaluation on the test split (held out by document hash, looked at once):
sampled (eval.num_samples at eval.temperature) and greedy; semantic similarity
(the reward: max(0, cosine) of MiniLM embeddings), chrF (0-100) and the
fraction of empty completions (the test split is read once a seed). Prints per-seed
rows and the mean ± standard error over seeds; section_vs_token.json stays under --out
(rewritten as seeds finish) and goes, with section_vs_token.png, to
results/sections/NAME.
"""

from __future__ import annotations

import os
import time

from flax import nnx

from experiments.lib import ROOT, heldout, plots, results, runs, stats, tables
from experiments.lib.runs import continue_cross_entropy, warm_started
from rlcode.config import loader
from rlcode.data.stream import TaskStream
from rlcode.train import grpo_loop

CONFIG = os.path.join(ROOT, "configs", "section_prediction.py")
GREEDY = ["--config.eval.temperature=0.0", "--config.eval.num_samples=1"]
KEYS = {"cosine": "semantic/cosine", "chrf": "semantic/lexical",
        "empty": "semantic/empty_fraction"}
ARMS = ("warm start", "grpo", "cross-entropy, equal compute", "cross-entropy, equal wall-clock")


def summary(result: dict, prefix: str = "") -> dict:
  """cosine, chrF (0-100) and empty fraction of an evaluation result."""
  out = {name: float(result[prefix + key]) for name, key in KEYS.items()}
  out["chrf"] *= 100.0
  return out


def evaluate_both(config, greedy, policy, tokenizer, tasks, mesh) -> dict:
  """summary of a policy's sampled and greedy answers to `tasks`."""
  return {"sampled": summary(runs.evaluation(config)(policy, tokenizer, tasks, mesh)),
          "greedy": summary(runs.evaluation(greedy)(policy, tokenizer, tasks, mesh))}


def prefill_tokens(config, tokenizer, train_tasks, steps: int) -> int:
  """Prompt tokens the GRPO run prefilled: its task stream replayed (one prefill a prompt)."""
  stream = TaskStream(train_tasks, config.rl.prompts_per_step, config.seed)
  return sum(len(tokenizer.encode(t.prompt)) for _ in range(steps) for t in stream.next())


def run_seed(seed: int, out: str, overrides: list[str]) -> dict:
  """One seed's three arms from one warm start, and their held-out rows."""
  base = overrides + [f"--config.seed={seed}", "--config.train.progress_bar=false",
                      f"--config.warmstart.cache_dir={os.path.join(out, 'warm_start')}"]
  workdir = os.path.join(out, f"seed{seed}", "grpo")
  tuning = base + [f"--config.workdir={workdir}"]
  config = loader.load_config(
      CONFIG, tuning + [heldout.through_loop(loader.load_config(CONFIG, tuning), "test")])
  greedy = loader.load_config(CONFIG, base + [f"--config.workdir={workdir}", *GREEDY])
  if os.path.exists(os.path.join(workdir, "checkpoints")):
    raise FileExistsError(f"{workdir} holds a previous run; remove it or pass another --out")

  start = time.time()
  rows = grpo_loop.train(config)
  grpo_wall = time.time() - start
  steps = runs.step_rows(rows)
  evals = runs.eval_rows(rows, "eval/reward_mean")
  tests = runs.eval_rows(rows, "test/reward_mean")
  seconds = runs.train_seconds(steps)
  update_positions = round(sum(r["update_tokens_per_s"] * r["update_seconds"] for r in steps))
  sampled = round(sum(r["rollout_tokens_per_s"] * r["rollout_seconds"] for r in steps))

  graphdef, params, tokenizer, mesh, train_tasks = warm_started(
      config, os.path.join(out, f"seed{seed}", "cross_entropy"))
  prefilled = prefill_tokens(config, tokenizer, train_tasks, len(steps))
  equal_positions = update_positions + (sampled + prefilled) // 3
  test_tasks = heldout.read(config, "test")
  policy = lambda p: nnx.merge(graphdef, p)
  model, _, _, _ = runs.restore_policy(config, workdir, mesh)
  ce = continue_cross_entropy(config, graphdef, params, train_tasks, tokenizer, mesh,
                              seconds=seconds, positions=equal_positions)
  at = ce["at_positions"]
  result = {
      "seed": seed,
      "grpo_run_seconds": grpo_wall,
      "compute": {
          "grpo": {"seconds": seconds, "steps": len(steps), "update_positions": update_positions,
                   "sampled_tokens": sampled, "prefilled_tokens": prefilled},
          "cross-entropy, equal compute": {k: at[k] for k in ("seconds", "steps", "positions")},
          "cross-entropy, equal wall-clock": {k: ce[k] for k in ("seconds", "steps", "positions")},
      },
      "warm start": {"sampled": summary(tests[0], "test/"),
                     "greedy": summary(runs.evaluation(greedy)(policy(params), tokenizer,
                                                              test_tasks, mesh))},
      "grpo": {"sampled": summary(tests[-1], "test/"),
               "greedy": summary(runs.evaluation(greedy)(model, tokenizer, test_tasks,
                                                        mesh))},
      "cross-entropy, equal compute": evaluate_both(config, greedy, policy(at["params"]),
                                                    tokenizer, test_tasks, mesh),
      "cross-entropy, equal wall-clock": evaluate_both(config, greedy, policy(ce["params"]),
                                                       tokenizer, test_tasks, mesh),
      "validation_curve": {"step": [r["step"] for r in evals],
                           "cosine": [r["eval/semantic/cosine"] for r in evals]},
      "grpo_curve": {k: [r.get(k) for r in steps] for k in (
          "reward_mean", "reward/semantic/group_std", "reward/semantic/cosine_lexical_corr",
          "completion_len")},
      "cross_entropy_loss": {"first": ce["loss_first"], "last": ce["loss_last"],
                             "at_equal_compute": at["loss_last"]},
      "n_test_tasks": len(test_tasks),
  }
  return result


def table(found: list[dict]) -> str:
  """Every arm's rows per seed and their mean ± SE over seeds."""
  cols = [("sampled", "cosine"), ("sampled", "chrf"), ("sampled", "empty"),
          ("greedy", "cosine"), ("greedy", "chrf"), ("greedy", "empty")]
  lines = []
  for arm in ARMS:
    for r in found:
      c = r["compute"].get(arm, {"seconds": 0.0, "steps": 0})
      lines.append([arm, r["seed"], f"{c['seconds']:.0f}", c["steps"],
                    *(f"{r[arm][m][k]:.3f}" for m, k in cols)])
    means = [stats.mean_se([r[arm][m][k] for r in found]) for m, k in cols]
    lines.append([f"**{arm}**", "mean ± SE", "", "", *(tables.pm(m, s) for m, s in means)])
  return tables.markdown(["policy", "seed", "train s", "steps", "sampled cosine",
                          "sampled chrF", "sampled empty", "greedy cosine", "greedy chrF",
                          "greedy empty"], lines, "ll" + "r" * 8)


def main():
  args, overrides = runs.parse_overrides(
      runs.seed_parser(__doc__.splitlines()[0], "section_vs_token", "sections"))
  found = runs.over_seeds(args.seeds, lambda seed: run_seed(seed, args.out, overrides),
                          args.out, "section_vs_token.json", overrides)
  text = table(found)
  print(text)
  print(f"{found[0]['n_test_tasks']} test tasks")

  fig, axes = plots.pyplot().subplots(1, 2, figsize=(10, 3.8))
  for ax, mode in zip(axes, ("sampled", "greedy")):
    for k, arm in enumerate(ARMS):
      m, s = stats.mean_se([r[arm][mode]["cosine"] for r in found])
      ax.bar(k, m, yerr=s, capsize=4, label=arm)
    ax.set_xticks(range(len(ARMS)), [a.replace(", ", "\n") for a in ARMS], fontsize=7)
    ax.set_title(f"test semantic similarity, {mode} (mean ± SE, {len(found)} seeds)",
                 fontsize=9)
    ax.grid(axis="y", alpha=0.3)
  png = plots.save(fig, results.folder("sections", args.name), "section_vs_token.png")
  runs.write_runs("sections", args.name, found, overrides, files=[png],
                  config=loader.load_config(CONFIG, [*overrides, f"--config.seed={args.seeds[0]}"]))


if __name__ == "__main__":
  main()
