"""Supervised training on reference solutions: the warm start, and cross-entropy controls.

Models trained from scratch cannot sample a single passing program, so GRPO's
group-relative advantages would all be zero; a short supervised phase on the
training split's reference solutions gives RL something to sharpen. The same loop
(`run`) continued for another run's wall-clock is the control an RL result is
compared with: did RL beat simply training longer on the references?
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh
from tqdm import tqdm

from rlcode.parallel import distributed, sharding
from rlcode import optim
from rlcode.rl import objective
from rlcode.rl import sequences
from rlcode.data.stream import TaskStream
from rlcode.data import edits
from rlcode.errors import BadInput
from rlcode.models import lora, moe


def make_sft_step(graphdef, optimizer: optax.GradientTransformation, mesh: Mesh,
                  state: optim.TrainState, example_batch: sequences.SequenceBatch,
                  trainable=nnx.Param, offload: bool = False):
  """(state, batch) -> (state, {"sft_loss", "grad_norm"}): the mean negative log-likelihood
  of the masked window targets (the reference tokens), logits computed there only (in
  chunks of the model's logits_chunk). Only the `trainable` params move (LoRA: the
  adapters)."""

  def loss_fn(params, batch):
    with sharding.activate(mesh), moe.collect() as routers:
      model = nnx.merge(graphdef, params)
      logp, _ = sequences.sequence_logprobs(model, batch, 1.0)
    balance, _ = moe.router_terms(model.cfg, routers)  # MoE: the balance loss, if asked
    return -objective.masked_mean(logp, batch.mask) + balance

  def step(state, batch):
    train, frozen = optim.split_trainable(state.params, trainable)
    loss, grads = jax.value_and_grad(
        lambda tr: loss_fn(nnx.merge_state(tr, frozen), batch))(train)
    opt_state = state.opt_state
    if offload:  # the optimiser state lives in host memory (optim.init_state)
      opt_state = jax.device_put(opt_state, jax.memory.Space.Device)
    updates, opt_state = optimizer.update(grads, opt_state, train)
    if offload:
      opt_state = jax.device_put(opt_state, jax.memory.Space.Host)
    params = nnx.merge_state(optax.apply_updates(train, updates), frozen)
    return (optim.TrainState(params, opt_state, state.step + 1),
            {"sft_loss": loss, "grad_norm": optax.tree.norm(grads)})

  state_sh = optim.state_shardings(state, mesh)
  return jax.jit(step, in_shardings=(state_sh, optim.batch_shardings(mesh, example_batch)),
                 out_shardings=(state_sh, None), donate_argnums=(0,))


def train_on_batches(graphdef, params, next_batch, mesh: Mesh, *,
                     optimizer: optim.OptimizerConfig, batch_size: int,
                     steps: int | None = None, seconds: float | None = None,
                     progress: bool = False, desc: str = "sft",
                     on_step=None, ema: float = 0.0, trainable=None) -> tuple[nnx.State, dict]:
  """Cross-entropy steps from `params` on batches of `batch_size` rows from `next_batch()`
  (SequenceBatches whose masks mark the targets).

  on_step(step, params, loss), when given, is called after every step (1-based), with
  the params after it and its loss (a device scalar): for evaluating mid-run. The params
  are valid during the call only (the next step donates them); copy what must outlive it.

  Runs `steps` steps, or, with `seconds`, steps until that much time was spent in them
  (a wall-clock budget, for controls that match another run's training time; batch
  building and the step count towards it, compilation of the first step too).
  ema in (0, 1): the returned params are an exponential moving average of the params
  after each step, `avg = ema * avg + (1 - ema) * params`, started at the first step's
  (Polyak averaging; the loop itself trains the raw params). 0 returns the last params.
  trainable: the params trained (default: the model's, rlcode.models.lora.trainable).

  Returns the new params and {"steps", "seconds", "loss_first", "loss_last",
  "target_tokens"}.
  """
  if (steps is None) == (seconds is None):
    raise ValueError(f"{desc}: give exactly one of steps and seconds")
  if not 0.0 <= ema < 1.0:  # a config value (warmstart.ema): one line from the CLI
    raise BadInput(f"{desc}: ema must be in [0, 1), got {ema}")
  opt = optim.make_optimizer(optimizer)
  model = nnx.merge(graphdef, params)
  trainable = lora.trainable(model.cfg) if trainable is None else trainable
  state = optim.init_state(model, opt, mesh, trainable, optimizer.offload)
  example = sequences.SequenceBatch.abstract(batch_size)
  step_fn = make_sft_step(graphdef, opt, mesh, state, example, trainable, optimizer.offload)
  batch_sh = optim.batch_shardings(mesh, example)
  avg = average = None  # with ema > 0: the moving average, updated in place every step
  if ema > 0:
    average = jax.jit(lambda avg, new: jax.tree.map(lambda a, b: ema * a + (1 - ema) * b,
                                                    avg, new), donate_argnums=(0,))
  losses, targets, spent = [], 0, 0.0
  bar = tqdm(total=steps, desc=desc, disable=not progress, leave=False)
  while (len(losses) < steps) if steps is not None else (spent < seconds):
    start = time.perf_counter()
    batch = next_batch()
    # Every process builds the whole batch (the same stream); each places its part.
    state, m = step_fn(state, distributed.put_global(batch, batch_sh))
    if ema > 0:  # before the next step donates state.params
      avg = (jax.tree.map(lambda x: x.copy(), state.params) if avg is None
             else average(avg, state.params))
    losses.append(m["sft_loss"])
    targets += int(batch.mask.sum())
    if on_step is not None:
      on_step(len(losses), state.params, m["sft_loss"])
    if seconds is not None:
      jax.block_until_ready(m["sft_loss"])
      spent += time.perf_counter() - start
    bar.update()
  bar.close()
  losses = [float(x) for x in jax.device_get(losses)]
  stats = {"steps": len(losses), "seconds": spent, "loss_first": losses[0],
           "loss_last": losses[-1], "target_tokens": targets}
  return (avg if ema > 0 else state.params), stats


def run(graphdef, params, tasks, tokenizer, mesh: Mesh, *, optimizer: optim.OptimizerConfig,
        batch_size: int, seed: int, steps: int | None = None, seconds: float | None = None,
        multiple: int = sequences.LENGTH_MULTIPLE, bucket: int = 1, progress: bool = False,
        desc: str = "sft", augment: Callable[[list, np.random.Generator], list] | None = None,
        ema: float = 0.0, trainable=None, on_step=None) -> tuple[nnx.State, dict]:
  """`train_on_batches` on the tasks' reference solutions: batches from a TaskStream
  seeded with `seed`, lengths padded to multiples of `multiple`
  (rlcode.rollout.sft_batch). bucket > 1: batches of similar lengths
  (`LengthBuckets`), so that less of each batch is padding. augment(tasks, rng), when
  given, rewrites each batch's tasks before they are tokenised (`renumber`), with a
  generator seeded from `seed`. ema, trainable, on_step: as in `train_on_batches`."""
  if bucket > 1:
    stream = LengthBuckets(tasks, tokenizer, batch_size, seed, bucket)
  else:
    stream = TaskStream(tasks, batch_size, seed)
  rng = np.random.default_rng([seed, 2])
  draw = (lambda: augment(stream.next(), rng)) if augment is not None else stream.next
  return train_on_batches(
      graphdef, params, lambda: sequences.sft_batch(tokenizer, draw(), multiple), mesh,
      optimizer=optimizer, batch_size=batch_size, steps=steps, seconds=seconds,
      progress=progress, desc=desc, ema=ema, trainable=trainable, on_step=on_step)


def renumber(max_offset: int) -> Callable[[list, np.random.Generator], list]:
  """An `augment` for `run`: every line_edit diff task of a batch shown as if its file had
  0..max_offset more lines on top (edits.shift_line_numbers; a fresh uniform draw at
  each visit), so that a range is fitted by copying its number from the numbered line,
  not by recalling the numbers of the rows seen before. Other tasks pass unchanged."""
  if max_offset < 0:
    raise ValueError(f"renumber: max_offset must be >= 0, got {max_offset}")

  def augment(tasks: list, rng: np.random.Generator) -> list:
    out = []
    for task in tasks:
      if task.kind == "diff" and task.extra.edit_format == "line_edit":
        if task.extra.shown_lines is not None:
          raise ValueError(f"renumber: task {task.id!r} counts the lines its prompt shows "
                           "(MiningConfig.line_numbers='shown'), so there are no file line "
                           "numbers to shift; leave warmstart.renumber at 0")
        prompt, reference = edits.shift_line_numbers(
            task.prompt, task.reference, int(rng.integers(0, max_offset + 1)))
        task = dataclasses.replace(task, prompt=prompt, reference=reference)
      out.append(task)
    return out
  return augment


class LengthBuckets:
  """Batches of similar lengths: `pool` batches' worth of tasks at a time from a seeded
  TaskStream (so every epoch still visits every task once), sorted by the length of their
  supervised row (prompt + reference + EOS) and cut into `pool` batches, which come out
  in a seeded random order. A batch is padded to its longest row, so with rows of mixed
  lengths this trains on the same rows with less padding (the grpo_diffs warm start:
  mean batch width 473 -> 433 tokens at pool 8, in multiples of 32). Which rows share
  a batch is no longer independent of their lengths; a pool of 1 is the plain stream.
  """

  def __init__(self, tasks, tokenizer, batch_size: int, seed: int, pool: int):
    if pool < 1:
      raise ValueError(f"LengthBuckets: pool must be >= 1, got {pool}")
    self.stream = TaskStream(tasks, batch_size * pool, seed)
    self.batch_size, self.seed = batch_size, seed
    bos = len(tokenizer.encode(""))
    self._length = {id(t): len(tokenizer.encode(t.prompt)) + len(tokenizer.encode(t.reference)) - bos
                    for t in self.stream.tasks}
    self._pending: list[list] = []
    self._drawn = 0

  def next(self) -> list:
    if not self._pending:
      tasks = sorted(self.stream.next(), key=lambda t: self._length[id(t)])
      batches = [tasks[i:i + self.batch_size] for i in range(0, len(tasks), self.batch_size)]
      order = np.random.default_rng([self.seed, self._drawn, 1]).permutation(len(batches))
      self._pending = [batches[i] for i in order]
      self._drawn += 1
    return self._pending.pop()
