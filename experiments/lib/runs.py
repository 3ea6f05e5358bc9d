"""Runs the seed experiments share: a training run in a fresh process, its step and eval
rows, the held-out split read once and scored, the cross-entropy control, and a seed
script's command line, its loop over the seeds, its gains and its result.

The cross-entropy control of a learning result: the warm start, continued. A GRPO
result is only a result if it beats simply training the warm start longer with the
same loss it was warm-started with. `continue_cross_entropy` takes the warm start's
parameters and keeps doing supervised steps on the training split's references
(prompt -> reference + EOS; config.warmstart's batch size; AdamW at the GRPO
optimiser's peak learning rate and warmup, no decay) until a wall-clock budget is
spent, and also keeps the parameters at the moment a token budget was reached (an
equal-compute point). Time counts what a training loop spends: building the batch and
the jitted step, compilation included. It evaluates nothing and writes no files
(diffs/seeds.py, diffs/vs_tests.py and sections/vs_token.py use it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import subprocess
import sys
import time

import jax
from flax import nnx

from experiments.lib import ROOT, heldout, results, stats, tables
from rlcode import optim
from rlcode.config import loader
from rlcode.data import sources
from rlcode.data.stream import TaskStream
from rlcode.policy import policy_eval
from rlcode.models.build import build_model
from rlcode.parallel import sharding
from rlcode.rl import rollout, sequences
from rlcode.runs.metrics import MetricsWriter, read_metrics
from rlcode.policy import sft, warm_start

# The seconds a GRPO step trains: sampling, the reward and the update.
GRPO_PARTS = ("rollout_seconds", "reward_seconds", "update_seconds")
# The diff reward's evaluation figures the diffs tables show (eval_splits' keys).
DIFF_KEYS = ("diff/format_valid", "diff/reward_mean", "diff/exact", "diff/similarity")


def train_process(config: str, flags, workdir: str, *, env=None) -> dict:
  """`python -m rlcode train --config CONFIG FLAGS...` in a fresh process from the
  repository root (FLAGS set --config.workdir=WORKDIR); the run must succeed.

  Returns {"rows": WORKDIR's metrics rows, "minutes": its wall-clock, "cpu_minutes": the
  process's CPU time, "load_before", "load_after": os.getloadavg() around it}.
  """
  cmd = [sys.executable, "-m", "rlcode", "train", "--config", config, *flags]
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  load_before, start = os.getloadavg(), time.time()
  subprocess.run(cmd, cwd=ROOT, env=env, check=True)
  minutes = (time.time() - start) / 60
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  return {"rows": read_metrics(workdir), "minutes": minutes,
          "cpu_minutes": (after.ru_utime + after.ru_stime - before.ru_utime
                          - before.ru_stime) / 60,
          "load_before": load_before, "load_after": os.getloadavg()}


def step_rows(rows) -> list[dict]:
  """The training steps' rows of a run's metrics (those with a loss)."""
  return [r for r in rows if "loss" in r]


def eval_rows(rows, key: str) -> list[dict]:
  """The rows of a run's metrics that hold `key` (an evaluation's)."""
  return [r for r in rows if key in r]


def train_seconds(steps, parts=GRPO_PARTS, optional=()) -> float:
  """The seconds the step rows spent in `parts` (each row must have them) and in
  `optional` (0 where a row has none)."""
  return sum(sum(r[p] for p in parts) + sum(r.get(p, 0.0) for p in optional)
             for r in steps)


def constant_lr(optimizer):
  """The optimizer of a config's optimizer section at its peak rate after warm-up, no decay
  (the control's: rlcode.optim.OptimizerConfig with end_lr_fraction 1)."""
  return dataclasses.replace(optim.OptimizerConfig.from_config(optimizer), end_lr_fraction=1.0)


def evaluation(config) -> policy_eval.Evaluation:
  """A config's evaluation (its eval section, rewards, seed and progress bar)."""
  return policy_eval.Evaluation(config.eval, config.rewards, config.reward_options,
                                config.seed, config.train.progress_bar)


def pass_at_1(config, policy, tokenizer, tasks, mesh) -> float:
  """pass@1 of a policy on `tasks` (the config's evaluation, with config.eval's samples),
  so that one read of a split serves every policy of a run."""
  return evaluation(config)(policy, tokenizer, tasks, mesh, ks=(1,))["pass@1"]


def restore_policy(config, path: str, mesh, step: int | None = None):
  """rlcode.policy.policy_eval.restore_policy of a run trained with `config`."""
  recipe = policy_eval.Recipe.of(config.model, config.optimizer, config.rl, config.seed)
  return policy_eval.restore_policy(recipe, path, mesh, step)


def restored_pass_at_1(config, directory: str, tasks, mesh, step: int | None = None) -> float:
  """pass_at_1 of the policy saved in `directory` (a workdir or a checkpoint) at `step`
  (None: the latest)."""
  model, tokenizer, _, _ = restore_policy(config, directory, mesh, step)
  return pass_at_1(config, model, tokenizer, tasks, mesh)


def eval_splits(config, graphdef, params, tokenizer, mesh, keys) -> dict:
  """The config's evaluation of params on the eval split ("eval") and, when set, the test split
  ("test", read through experiments.lib.heldout), each cut to the tasks that fit;
  {"eval": {key: value}, "test": ...}."""
  out = {}
  for name, split in (("eval", config.data.eval_split), ("test", config.data.test_split)):
    if not split:
      continue
    tasks, _ = rollout.fit_tasks(heldout.tasks(config, split), tokenizer, split=name,
                                 max_seq_len=config.model.arch.max_seq_len,
                                 max_new_tokens=config.eval.max_new_tokens,
                                 drop_too_long=bool(config.data.drop_too_long))
    result = evaluation(config)(nnx.merge(graphdef, params), tokenizer, tasks, mesh)
    out[name] = {k: result[k] for k in keys}
  return out


def warm_started(config, workdir: str):
  """(graphdef, warm-start params, tokenizer, mesh, training tasks) of a config
  (the training tasks of config.data: the ones GRPO trains on).

  The warm start comes from config.warmstart.cache_dir when it holds this
  config's (rlcode.policy.warm_start), so it is the one the GRPO run started from.
  Its step-0 row goes to workdir/metrics.jsonl.
  """
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer = build_model(config.model, mesh, config.seed)
  tasks, _ = rollout.fit_tasks(sources.load(config.data, config.data.train_split), tokenizer,
                               split="train", max_seq_len=model.cfg.max_seq_len,
                               max_new_tokens=config.rl.max_new_tokens,
                               drop_too_long=bool(config.data.drop_too_long))
  graphdef, params = nnx.split(model, nnx.Param)
  metrics = MetricsWriter(workdir, tensorboard=False)
  job = warm_start.Job.of(config.warmstart, seed=config.seed, model=config.model,
                          data=config.data, rl=config.rl, progress=config.train.progress_bar)
  warm_tasks, _ = warm_start.warm_start_tasks(job, tokenizer, model.cfg.max_seq_len, tasks)
  params = warm_start.warm_start(job, graphdef, params, warm_tasks, tokenizer, mesh, metrics)
  metrics.close()
  return graphdef, params, tokenizer, mesh, tasks


def continue_cross_entropy(config, graphdef, params, tasks, tokenizer, mesh, *,
                           seconds: float, positions: int = 0) -> dict:
  """Supervised steps from `params` until `seconds` of training (module docstring).

  Returns {"params", "steps", "seconds", "positions" (token positions through
  forward+backward), "loss_first", "loss_last"} and, when `positions` > 0, the
  same at the first step whose running total reached it under "at_positions".
  """
  optimizer = optim.make_optimizer(constant_lr(config.optimizer))
  # The step donates its state: train a copy, so the caller's params stay usable
  # (the warm start is evaluated after this control).
  params = jax.tree.map(lambda x: x.copy(), params)
  state = optim.init_state(nnx.merge(graphdef, params), optimizer, mesh)
  multiple = int(config.rl.length_multiple)
  stream = TaskStream(tasks, config.warmstart.batch_size, config.seed + 2)
  step_fn, spent, steps, done_positions, losses = None, 0.0, 0, 0, []
  at_positions = None
  while spent < seconds or (positions and at_positions is None):
    start = time.perf_counter()
    batch = sequences.sft_batch(tokenizer, stream.next(), multiple)
    if step_fn is None:
      step_fn = sft.make_sft_step(graphdef, optimizer, mesh, state, batch)
    state, m = step_fn(state, batch)
    losses.append(float(jax.device_get(m["sft_loss"])))
    spent += time.perf_counter() - start
    steps += 1
    done_positions += batch.tokens.shape[0] * (batch.tokens.shape[1] - 1)
    if positions and at_positions is None and done_positions >= positions:
      at_positions = {"params": jax.tree.map(lambda x: x.copy(), state.params),
                      "steps": steps, "seconds": spent, "positions": done_positions,
                      "loss_first": losses[0], "loss_last": losses[-1]}
  out = {"params": state.params, "steps": steps, "seconds": spent,
         "positions": done_positions, "loss_first": losses[0], "loss_last": losses[-1]}
  if positions:
    out["at_positions"] = at_positions
  return out


def seed_parser(description: str, name: str, topic: str, *,
                control: bool = False) -> argparse.ArgumentParser:
  """A seed script's parser: --seeds (default 0 1 2), --out (default experiments/out/NAME)
  and --name (default NAME: the result's folder under results/TOPIC/); with `control`,
  after --seeds, the arms of a script with a cross-entropy control (--arms: grpo and ce
  by default) and --no-held-out (its tuning mode)."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  if control:
    parser.add_argument("--arms", nargs="+", default=["grpo", "ce"], choices=["grpo", "ce"])
    parser.add_argument("--no-held-out", action="store_true",
                        help="tuning mode: report the validation split only")
  parser.add_argument("--out", default=os.path.join(ROOT, f"experiments/out/{name}"))
  parser.add_argument("--name", default=name, help=f"the result's name under results/{topic}/")
  return parser


def parse_overrides(parser: argparse.ArgumentParser):
  """(args, overrides): the parser's arguments, and the rest, which must all be
  --config.a.b=value overrides (anything else is a parser error)."""
  args, overrides = parser.parse_known_args()
  for item in overrides:
    if not item.startswith(loader.PREFIX):
      parser.error(f"unknown argument {item!r}")
  return args, overrides


def over_seeds(seeds, run_seed, out: str, filename: str, overrides) -> list[dict]:
  """run_seed(seed) of each seed in turn, `out` made first if absent; after each, the runs
  so far with the overrides ({"runs", "overrides"}) rewritten to out/filename, so that a
  process cut short keeps the seeds it finished. Returns the runs."""
  os.makedirs(out, exist_ok=True)
  found = []
  for seed in seeds:
    found.append(run_seed(seed))
    results.write_json({"runs": found, "overrides": overrides}, os.path.join(out, filename))
  return found


def report_gains(found, held_of, *, control: bool, overrides, path: str) -> dict:
  """The gains of the runs `found` (stats.seed_gains of their "val_gain" and of `held_of`,
  with `control`) printed a line each, and the payload {"runs", "summary": those gains,
  "overrides"} rewritten to `path`; returns the payload."""
  summary = stats.seed_gains([r["val_gain"] for r in found], held_of, control=control)
  print(tables.gains(summary, len(found)))
  payload = {"runs": found, "summary": summary, "overrides": overrides}
  results.write_json(payload, path)
  return payload


def write_runs(topic: str, name: str, found, overrides, *, config, files=()) -> str:
  """The runs with the overrides ({"runs", "overrides"}) written as results/TOPIC/NAME
  (results.write, with `config` and `files`); prints "wrote FOLDER" and returns it."""
  where = results.write(topic, name, {"runs": found, "overrides": overrides}, config=config,
                        files=files)
  print("wrote", where)
  return where
