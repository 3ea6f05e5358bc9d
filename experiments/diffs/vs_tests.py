"""Does the diff reward keep RL on weak tests from passing them the wrong way?

    python -m experiments.diffs.vs_tests [--seeds 0 1 2] [--out DIR] [--name NAME]
        [--config.a.b=v ...]

Claim: trained on weak tests alone, a policy learns to pass them
without making the real change; adding SWE-RL's diff reward pulls it toward
the real change. Setting: configs/grpo_diffs.py's tasks (the generated edit
history, data/make_edit_history.py), whose tasks carry two test sets: the
visible ones (checks/: one assert per function, which a bug fix's unchanged
function and an added parameter's old calls already pass) and the hidden ones
(tests/: every case, the regression cases of a fix included).

Two arms per seed, both GRPO from the same warm start (the config's, through
its warm-start cache under --out), the config's settings otherwise:
- "tests": reward = the visible tests (1 if they all pass after the answer is
  applied, else 0; an answer that does not apply runs nothing and scores 0);
- "tests+diff": reward = the visible tests + the diff reward (-1 for an answer
  that does not parse or apply, else the SWE-RL similarity).

After training, each policy (and the warm start) samples eval.num_samples
answers to every task of the test split (held out: read once a seed and looked at
once, here), and
every answer is scored three ways: visible tests passed, hidden tests passed,
and the diff reward (its mean; exact: the same change as the real one).
"passed the wrong way" is the share of answers passing the visible tests and
failing the hidden ones.

Prints the table (per seed, and mean ± standard error over seeds); diff_vs_tests.json
stays under --out (default experiments/out/diff_vs_tests, rewritten as seeds finish)
and goes to results/diffs/NAME (default diff_vs_tests).
"""

from __future__ import annotations

import os
import time

import ml_collections
import numpy as np
from flax import nnx

from experiments.lib import ROOT, heldout, runs, stats, tables
from rlcode import rewards
from rlcode.config import loader
from rlcode.policy import policy_eval
from rlcode.parallel import sharding
from rlcode.rl import rollout
from rlcode.train import grpo_loop

CONFIG = os.path.join(ROOT, "configs", "grpo_diffs.py")
ARMS = {
    "tests": ({"tests": 1.0}, {"tests": {"test_set": "visible"}}),
    "tests+diff": ({"tests": 1.0, "diff": 1.0}, {"tests": {"test_set": "visible"}, "diff": {}}),
}
COLUMNS = ("visible_pass", "hidden_pass", "wrong_way", "diff_reward", "exact", "format_valid")


def score_three_ways(tasks, texts) -> dict:
  """Visible and hidden test passes and the diff reward of answers to diff tasks with tests."""
  visible = rewards.get("tests")(tasks, texts, test_set="visible").scores
  hidden = rewards.get("tests")(tasks, texts, test_set="hidden").scores
  diff = rewards.get("diff")(tasks, texts)
  return {"visible_pass": float(visible.mean()), "hidden_pass": float(hidden.mean()),
          "wrong_way": float(np.mean((visible == 1) & (hidden == 0))),
          "diff_reward": diff.metrics["reward_mean"], "exact": diff.metrics["exact"],
          "format_valid": diff.metrics["format_valid"]}


def held_out(config, model, tokenizer, tasks, mesh) -> dict:
  """score_three_ways of eval.num_samples answers of a policy to each of `tasks`."""
  ev = config.eval
  row_tasks, texts = policy_eval.sample_completions(
      model, tokenizer, tasks, num_samples=ev.num_samples, temperature=ev.temperature,
      max_new_tokens=ev.max_new_tokens, seed=config.seed + 7919,
      batch_prompts=ev.batch_prompts, mesh=mesh)
  return score_three_ways(row_tasks, texts)


def arm_config(seed: int, out: str, arm: str, overrides: list[str]):
  """configs/grpo_diffs.py for one arm: its workdir, the shared warm-start cache, its reward."""
  config = loader.load_config(CONFIG, overrides + [
      f"--config.seed={seed}", f"--config.workdir={os.path.join(out, f'seed{seed}_{arm}')}",
      f"--config.warmstart.cache_dir={os.path.join(out, 'warm_start')}",
      "--config.train.progress_bar=false"])
  weights, options = ARMS[arm]
  with config.unlocked():
    config.rewards = ml_collections.ConfigDict(weights)
    config.reward_options = ml_collections.ConfigDict(options)
  return config


def run_seed(seed: int, out: str, overrides: list[str]) -> dict:
  """Both arms of one seed and its warm start, scored on the test split (read once)."""
  result, tasks = {"seed": seed}, None
  for arm in ARMS:
    config = arm_config(seed, out, arm, overrides)
    if os.path.exists(os.path.join(config.workdir, "checkpoints")):
      raise FileExistsError(f"{config.workdir} holds a previous run; remove it or pass "
                            "another --out")
    wall, cpu = time.time(), time.process_time()
    rows = grpo_loop.train(config)
    steps = [r for r in rows if "loss" in r]
    mesh = sharding.mesh_from_config(config.mesh)
    model, tokenizer, _, _ = runs.restore_policy(config, config.workdir, mesh)
    tasks = tasks or test_tasks(config, tokenizer)  # the arms differ in their reward only
    result[arm] = {**held_out(config, model, tokenizer, tasks, mesh),
                   "minutes": (time.time() - wall) / 60,
                   "cpu_minutes": (time.process_time() - cpu) / 60,
                   "load": os.getloadavg()[0],
                   "train_reward": [r["reward_mean"] for r in steps],
                   "groups_with_signal": [r["groups_with_signal"] for r in steps]}
  graphdef, params, tokenizer, mesh, _ = runs.warm_started(config,
                                                            os.path.join(out, f"seed{seed}_ws"))
  result["warm start"] = held_out(config, nnx.merge(graphdef, params), tokenizer, tasks, mesh)
  return result


def test_tasks(config, tokenizer):
  """The test split's tasks that fit the context."""
  tasks, _ = rollout.fit_tasks(heldout.read(config, "test"), tokenizer, split="test",
                               max_seq_len=config.model.arch.max_seq_len,
                               max_new_tokens=config.eval.max_new_tokens,
                               drop_too_long=bool(config.data.drop_too_long))
  return tasks


def table(found: list[dict]) -> str:
  """Every policy's rows per seed and their mean ± SE over seeds."""
  lines = []
  for name in ("warm start", *ARMS):
    for r in found:
      lines.append([name, r["seed"], *(f"{r[name][c]:.3f}" for c in COLUMNS)])
    means = [stats.mean_se([r[name][c] for r in found]) for c in COLUMNS]
    lines.append([f"**{name}**", "mean ± SE", *(tables.pm(m, s) for m, s in means)])
  return tables.markdown(["policy", "seed", "visible tests pass", "hidden tests pass",
                          "passed the wrong way", "diff reward", "exact", "format valid"],
                         lines, "ll" + "r" * 6)


def main():
  args, overrides = runs.parse_overrides(
      runs.seed_parser(__doc__.splitlines()[0], "diff_vs_tests", "diffs"))
  found = runs.over_seeds(args.seeds, lambda seed: run_seed(seed, args.out, overrides),
                          args.out, "diff_vs_tests.json", overrides)
  print(table(found))
  runs.write_runs("diffs", args.name, found, overrides,
                  config=arm_config(args.seeds[0], args.out, "tests+diff", overrides))


if __name__ == "__main__":
  main()
