"""The supervised warm start before GRPO: its tasks, its seed, and a cache keyed by what it
depends on, so that the arms of an experiment start from the very same parameters.

Models trained from scratch cannot sample a single passing program, so GRPO's
group-relative advantages would all be zero; a short supervised phase on the training
split's references (and `warmstart.data`, practice data) gives RL something to sharpen.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from etils import epath
from flax import nnx

from rlcode import optim
from rlcode.errors import BadInput
from rlcode.models import lora
from rlcode.data import sources
from rlcode.rl import rollout
from rlcode.runs import checkpoint
from rlcode.policy import sft


@dataclasses.dataclass(frozen=True)
class Job:
  """What the warm start reads of a run's config: its section (`ws`, config.warmstart),
  its seed (`warmstart.seed` when set, so runs of several seeds can share one warm start,
  as a pretrained checkpoint is shared, and differ only in what comes after; else the
  run's), the model and data sections, and of the RL section the batch length multiple
  and the rollout budget (which decides the training tasks that fit)."""
  ws: Any
  seed: int
  model: Any
  data: Any
  length_multiple: int
  max_new_tokens: int
  progress: bool = False

  @classmethod
  def of(cls, ws, *, seed: int, model, data, rl, progress: bool = False) -> "Job":
    """The job of a run with `seed` and these sections (config.warmstart, config.model,
    config.data, config.rl)."""
    return cls(ws, seed if ws.seed is None else ws.seed, model, data, rl.length_multiple,
               rl.max_new_tokens, progress)


def warm_start_tasks(job: Job, tokenizer, max_seq_len: int, train_tasks):
  """The warm start's tasks: the training tasks but the tests-only ones
  (rlcode.data.sources.with_references), each `warmstart.train_repeats` times (the
  training split's weight against the extra section's), and the train split of
  `warmstart.data` when it is set, fitted to the context as the training tasks are
  (dropped and counted, "data/warmstart_*"). Returns (tasks, counts)."""
  ws = job.ws
  own = sources.with_references(train_tasks) * ws.train_repeats
  if not own and ws.data is None:
    raise BadInput(f"the warm start has no reference solution to train on (data.reference_share"
                   f"={job.data.reference_share} left none of {len(train_tasks)} tasks)")
  if ws.data is None:
    return own, {}
  extra, counts = rollout.fit_tasks(
      sources.load(ws.data, ws.data.train_split), tokenizer, split="warmstart",
      max_seq_len=max_seq_len, max_new_tokens=job.max_new_tokens, drop_too_long=True,
      prompt_format=ws.data.prompt_format)
  return own + extra, counts


def warm_start(job: Job, graphdef, params, tasks, tokenizer, mesh, log):
  """Supervised steps on reference solutions; returns the params (logs one step-0 row
  through `log(step, row)`).

  Batches are padded to multiples of `rl.length_multiple`, as the GRPO updates are;
  `warmstart.bucket` > 1 batches rows of similar lengths together
  (rlcode.policy.sft.LengthBuckets); `warmstart.renumber` > 0 shows each line-edit row's
  file as if it had up to that many more lines on top (rlcode.policy.sft.renumber);
  `warmstart.ema` > 0 returns a moving average of the params. With `warmstart.cache_dir`
  set, the result is kept there under a hash of everything it depends on
  (`warm_start_key`) and a later run with the same key loads it instead of training
  again: several runs (arms of an experiment, a cross-entropy control) then start from
  the very same parameters.
  """
  ws = job.ws
  cache = os.path.join(ws.cache_dir, warm_start_key(job)) if ws.cache_dir else ""
  if cache and epath.Path(cache).exists():
    with checkpoint.Checkpointer(cache, create=False) as ckpt:
      if ckpt.latest_step() is not None:
        params, row, _ = ckpt.restore(checkpoint.abstract_like(params))
        log(0, row)
        return params
  params, stats = sft.run(graphdef, params, tasks, tokenizer, mesh,
                          optimizer=optim.OptimizerConfig.from_config(ws.optimizer),
                          batch_size=ws.batch_size, seed=job.seed + 1,
                          steps=ws.steps, multiple=job.length_multiple, bucket=ws.bucket,
                          augment=sft.renumber(ws.renumber) if ws.renumber else None,
                          progress=job.progress, desc="warm start", ema=ws.ema,
                          trainable=warm_start_trainable(job.model))
  row = {"sft_loss_first": stats["loss_first"], "sft_loss_last": stats["loss_last"],
         "sft_steps": ws.steps}
  log(0, row)
  if cache:
    with checkpoint.Checkpointer(cache) as ckpt:
      ckpt.save(ws.steps, params, row)
      ckpt.wait()
  return params


def warm_start_trainable(model_cfg):
  """What the warm start trains (model_cfg: config.model). Under model.lora a checkpoint's
  warm start trains the adapters, as the RL after it does; a model built from scratch has
  no base to adapt until its warm start, which trains every parameter but the adapters
  (they stay at B = 0, adding nothing, so the warm-started base is the full fine-tune's
  exactly)."""
  if model_cfg.lora is None:
    return nnx.Param
  return lora.LoRAParam if model_cfg.hf_path else nnx.All(nnx.Param, nnx.Not(lora.LoRAParam))


# The agent demonstrator's keys, once in the warm start's section, at the values every GRPO
# warm start had then: hashed as before, so warm starts cached then still match.
_FORMER_KEYS = {"guess_fraction": 0.0, "guess_families": (), "decoy_copy": 0.0,
                "note_trust": 0.0}


def warm_start_key(job: Job) -> str:
  """A hash of what the warm start's parameters depend on: the seed, model, data,
  warm-start settings (its cache_dir aside), the batch length multiple and the
  rollout budget (which decides the training tasks that fit). Keys left unset (None) are
  left out, so a key the schema gains later, unset, keeps a cached warm start's hash."""
  ws = {k: v for k, v in job.ws.to_dict().items() if k not in ("cache_dir", "seed")}
  ws.update(_FORMER_KEYS)
  parts = {"seed": job.seed, "model": job.model.to_dict(),
           "data": job.data.to_dict(), "warmstart": ws,
           "length_multiple": job.length_multiple,
           # Tasks whose prompt leaves no room for the rollouts are dropped before it.
           "max_new_tokens": job.max_new_tokens}
  # The data section's splits and evaluation size do not change the training tasks.
  for key in ("eval_split", "test_split", "max_eval_tasks", "data_dir"):
    parts["data"].pop(key, None)
  if ws["data"]:
    ws["data"].pop("data_dir", None)  # where its datasets are cached, not what they hold
  text = json.dumps(_set(parts), sort_keys=True, default=list)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def _set(tree):
  """`tree` without the mapping entries whose value is None, at any depth."""
  if isinstance(tree, dict):
    return {k: _set(v) for k, v in tree.items() if v is not None}
  return tree
