"""The run scaffold every training loop shares: workdir, config record, resume, metrics,
checkpoint and evaluation cadence, progress.

    with scaffold.Run(config, desc="grpo") as run:
      if run.fresh:
        state = ...                                  # initialise (a warm start, ...)
      else:
        tree, meta = run.restore(abstract_tree)      # the latest checkpoint
      for step in run.steps():                       # from the restored step on
        ...
        run.log(step + 1, row)
        if run.eval_due(step + 1): ...
        if run.save_due(step + 1): run.save(step + 1, tree, meta)
    run.rows                                         # every row logged

A fresh run records its config (workdir/config.json) and refuses a workdir that already
has metrics; a resumed one checks that its config is the recorded one (outside the
resumable keys) and drops the metrics rows after the restored step. Leaving the `with`
block (normally or by an exception) waits for pending saves and closes the checkpoint
manager and the metrics writers. In a multi-process run only the main process writes
files (`main=False` elsewhere); every process saves and restores checkpoints together.
This module must not know what a loop trains.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from tqdm import tqdm

from rlcode.config import record
from rlcode.runs import checkpoint
from rlcode.runs.metrics import MetricsWriter

log = logging.getLogger(__name__)


class Run:
  """One training run in config.workdir (see the module docstring)."""

  def __init__(self, config, *, desc: str, main: bool = True):
    self.config, self.desc, self.main = config, desc, main
    self.workdir = config.workdir
    self.ckpt = checkpoint.Checkpointer(os.path.join(self.workdir, "checkpoints"),
                                        keep=config.train.keep_checkpoints)
    self.start_step = self.ckpt.latest_step() or 0
    self.fresh = self.ckpt.latest_step() is None
    self.rows: list[dict] = []
    self._bar = None
    if self.fresh:
      self.metrics = MetricsWriter(self.workdir, enabled=main, logging_cfg=config.logging,
                                   config=record.plain(config))
      if main:
        record.write_run_config(config, self.workdir)
    else:
      record.check_resume(config, self.workdir)
      self.metrics = None  # opened by `restore`, which knows the step restored

  # ------------------------------------------------------------ state
  def restore(self, abstract: Any) -> tuple[Any, dict]:
    """(tree, meta) of the newest intact checkpoint, arrays placed as `abstract`'s;
    metrics rows after its step are dropped. A corrupt checkpoint (a file cut by a
    crash, say) is skipped with a warning naming it; none intact is an error."""
    corrupt = []
    for step in self.ckpt.all_steps():
      try:
        tree, meta, self.start_step = self.ckpt.restore(abstract, step)
        break
      except checkpoint.CorruptCheckpoint as e:
        log.warning("%s; resuming from an older checkpoint", e.message)
        corrupt.append(e.message)
    else:
      raise checkpoint.CorruptCheckpoint(
          f"no intact checkpoint in {self.ckpt.directory} to resume from ({'; '.join(corrupt)})"
          "; delete the workdir's checkpoints to start over")
    self.metrics = MetricsWriter(self.workdir, resume_step=self.start_step, enabled=self.main,
                                 logging_cfg=self.config.logging,
                                 config=record.plain(self.config))
    return tree, meta

  def save(self, step: int, tree: Any, meta: Mapping[str, Any]) -> None:
    self.ckpt.save(step, tree, dict(meta))

  def save_once(self, name: str, tree: Any, meta: Mapping[str, Any]) -> None:
    """A checkpoint in workdir/NAME of its own, outside the rotation (the warm start)."""
    checkpoint.save_once(os.path.join(self.workdir, name), 0, tree, dict(meta))

  # ------------------------------------------------------------ cadence
  def steps(self) -> Iterator[int]:
    """The steps left, with a progress bar (train.progress_bar, main process)."""
    total = self.config.train.steps
    self._bar = tqdm(range(self.start_step, total), initial=self.start_step, total=total,
                     desc=self.desc,
                     disable=not (self.config.train.progress_bar and self.main))
    return iter(self._bar)

  def postfix(self, **values: float) -> None:
    if self._bar is not None:
      self._bar.set_postfix({k: f"{v:.3f}" for k, v in values.items()})

  def eval_at_start(self) -> bool:
    """Whether the loop evaluates before its first step: a fresh run with evaluations."""
    tr = self.config.train
    return self.start_step == 0 and bool(tr.eval_every or tr.eval_steps)

  def eval_due(self, done: int) -> bool:
    tr = self.config.train
    every = tr.eval_every and (done % tr.eval_every == 0 or done == tr.steps)
    return bool(every) or done in tr.eval_steps

  def save_due(self, done: int) -> bool:
    tr = self.config.train
    return done % tr.checkpoint_every == 0 or done == tr.steps

  def is_last(self, done: int) -> bool:
    return done == self.config.train.steps

  # ------------------------------------------------------------ metrics
  def log(self, step: int, row: Mapping[str, object]) -> dict:
    """Writes one metrics row (where this process writes) and keeps it in `rows`."""
    if self.metrics is None:
      raise RuntimeError("Run.log before Run.restore on a resumed run")
    written = self.metrics.write(step, row)
    self.rows.append(written)
    return written

  # ------------------------------------------------------------ the end
  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
    try:
      self.ckpt.wait()
    finally:
      self.ckpt.close()
      if self.metrics is not None:
        self.metrics.close()

  def __enter__(self) -> Run:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
