"""The cross-entropy control of a learning result: the warm start, continued.

A GRPO result is only a result if it beats simply training the warm start
longer with the same loss it was warm-started with. `continue_cross_entropy`
takes the warm start's parameters and keeps doing supervised steps on the
training split's references (prompt -> reference + EOS; config.warmstart's
batch size; AdamW at the GRPO optimiser's peak learning rate and warmup, no
decay) until a wall-clock budget is spent, and also keeps the parameters at the
moment a token budget was reached (an equal-compute point). Time counts what a
training loop spends: building the batch and the jitted step, compilation
included.

Used by experiments/grpo_diffs_seeds.py, experiments/diff_vs_tests.py and
experiments/section_vs_token.py; it must not evaluate or write files.
"""

from __future__ import annotations

import dataclasses
import time

import jax
from flax import nnx

from rlcode.train import sft
from rlcode.parallel import sharding
from rlcode import optim
from rlcode.rl import rollout
from rlcode.rl import sequences
from rlcode.train import warm_start
from rlcode.data.stream import TaskStream
from rlcode.data import sources
from rlcode.runs.metrics import MetricsWriter
from rlcode.models.build import build_model


def warm_started(config, workdir: str):
  """(graphdef, warm-start params, tokenizer, mesh, training tasks) of a config
  (the training tasks of config.data: the ones GRPO trains on).

  The warm start comes from config.warmstart.cache_dir when it holds this
  config's (rlcode.train.warm_start), so it is the one the GRPO run started from.
  Its step-0 row goes to workdir/metrics.jsonl.
  """
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer = build_model(config.model, mesh, config.seed)
  tasks, _ = rollout.fit_tasks(sources.load(config.data, config.data.train_split), tokenizer,
                               split="train", max_seq_len=model.cfg.max_seq_len,
                               max_new_tokens=config.rl.max_new_tokens,
                               drop_too_long=bool(config.data.get("drop_too_long")))
  graphdef, params = nnx.split(model, nnx.Param)
  metrics = MetricsWriter(workdir, tensorboard=False)
  warm_tasks, _ = warm_start.warm_start_tasks(config, tokenizer, model.cfg.max_seq_len, tasks)
  params = warm_start.warm_start(config, graphdef, params, warm_tasks, tokenizer, mesh, metrics)
  metrics.close()
  return graphdef, params, tokenizer, mesh, tasks


def continue_cross_entropy(config, graphdef, params, tasks, tokenizer, mesh, *,
                           seconds: float, positions: int = 0) -> dict:
  """Supervised steps from `params` until `seconds` of training (module docstring).

  Returns {"params", "steps", "seconds", "positions" (token positions through
  forward+backward), "loss_first", "loss_last"} and, when `positions` > 0, the
  same at the first step whose running total reached it under "at_positions".
  """
  opt_cfg = dataclasses.replace(optim.OptimizerConfig.from_config(config.optimizer),
                                end_lr_fraction=1.0)
  optimizer = optim.make_optimizer(opt_cfg)
  # The step donates its state: train a copy, so the caller's params stay usable
  # (the warm start is evaluated after this control).
  params = jax.tree.map(lambda x: x.copy(), params)
  state = optim.init_state(nnx.merge(graphdef, params), optimizer, mesh)
  multiple = int(config.rl.get("length_multiple", sequences.LENGTH_MULTIPLE))
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


def mean_se(values) -> tuple[float, float]:
  """Mean and standard error (sample standard deviation / sqrt(n); 0 for one value)."""
  values = [float(v) for v in values]
  n = len(values)
  mean = sum(values) / n
  if n < 2:
    return mean, 0.0
  var = sum((v - mean) ** 2 for v in values) / (n - 1)
  return mean, (var / n) ** 0.5
