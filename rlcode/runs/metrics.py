"""Metrics: JSON lines in the workdir (the source of truth), TensorBoard, Weights & Biases.

metrics.jsonl holds one object per training step and one per evaluation, each with
"step". On resume, rows after the restored step are dropped first, so the file reads as
if the run had never been interrupted, and a torn last line (a crash mid-write) is
dropped with a warning; a fresh run never touches an existing file (it refuses to
start). TensorBoard events (`logging.tensorboard`) and a W&B run (`logging.wandb`, the
`wandb` extra; offline by default, so it needs no network) mirror the scalars.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import warnings
from collections.abc import Mapping

from rlcode.errors import BadInput, MissingInput

METRICS_FILE = "metrics.jsonl"
WANDB_ID_FILE = "wandb_id"


def _clean(value):
  if hasattr(value, "item"):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)  # JSON has no NaN/inf; keep them visible as strings
  return value


def _scalars(row: Mapping) -> dict[str, float]:
  return {k: v for k, v in row.items()
          if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


class _TensorBoard:

  def __init__(self, workdir: str):
    from tensorboardX import SummaryWriter
    self._writer = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, row: Mapping) -> None:
    for k, v in _scalars(row).items():
      self._writer.add_scalar(k, v, step)

  def close(self) -> None:
    self._writer.close()


class _Wandb:
  """One W&B run per workdir: its id is kept in the workdir, so a resumed run appends to it."""

  def __init__(self, workdir: str, logging_cfg, config: Mapping | None):
    try:
      import wandb
    except ImportError:
      raise BadInput("logging.wandb=true needs the wandb package: pip install 'rlcode[wandb]'"
                     ) from None
    id_path = os.path.join(workdir, WANDB_ID_FILE)
    if os.path.isfile(id_path):
      with open(id_path) as f:
        run_id = f.read().strip()
    else:
      run_id = secrets.token_hex(4)  # W&B's ids are 8 lowercase letters or digits
      with open(id_path, "w") as f:
        f.write(run_id + "\n")
    self._run = wandb.init(project=logging_cfg.wandb_project, entity=logging_cfg.wandb_entity,
                           mode=logging_cfg.wandb_mode, dir=workdir, id=run_id,
                           resume="allow", config=dict(config or {}),
                           name=os.path.basename(os.path.normpath(workdir)))

  def write(self, step: int, row: Mapping) -> None:
    self._run.log(_scalars(row), step=step)

  def close(self) -> None:
    self._run.finish()


class MetricsWriter:
  """Appends rows to workdir/metrics.jsonl and mirrors scalars to the configured writers.

  enabled=False (every process of a multi-process run but the first) touches no file:
  `write` only returns the row. logging_cfg: a config's `logging` section (None:
  TensorBoard only); config: what a W&B run records as its config.
  """

  def __init__(self, workdir: str, *, resume_step: int | None = None, enabled: bool = True,
               logging_cfg=None, config: Mapping | None = None):
    self.enabled = enabled
    self._writers = []
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, METRICS_FILE)
    if os.path.exists(self.path):
      if resume_step is None:
        raise BadInput(f"{self.path} exists but this run starts fresh (no checkpoint to "
                       "resume from): use another workdir, or delete the old run's files")
      rows = read_metrics(workdir, torn_tail="drop")
      with open(self.path, "w") as f:
        for r in rows:
          if r["step"] <= resume_step:
            f.write(json.dumps(r) + "\n")
    if logging_cfg is None or logging_cfg.tensorboard:
      self._writers.append(_TensorBoard(workdir))
    if logging_cfg is not None and logging_cfg.wandb:
      self._writers.append(_Wandb(workdir, logging_cfg, config))

  def write(self, step: int, metrics: Mapping[str, object]) -> dict:
    row = {"step": int(step), **{k: _clean(v) for k, v in metrics.items()}}
    if not self.enabled:
      return row
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
    for writer in self._writers:
      writer.write(step, row)
    return row

  def close(self) -> None:
    for writer in self._writers:
      writer.close()
    self._writers = []


def read_metrics(workdir: str, *, torn_tail: str = "error") -> list[dict]:
  """The rows of workdir/metrics.jsonl. torn_tail="drop": a last line that is not JSON (a
  crash mid-write) is dropped with a warning; any other bad line is an error naming it."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.isfile(path):
    raise MissingInput(f"{path} does not exist: is {workdir!r} a training workdir?")
  with open(path, "rb") as f:
    lines = f.read().split(b"\n")
  rows = []
  last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line.decode("utf-8")))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      if torn_tail == "drop" and n - 1 == last:
        warnings.warn(f"{path}:{n}: a torn last line (a crash mid-write?), dropped; its "
                      "step is recomputed from the checkpoint", stacklevel=2)
        continue
      raise BadInput(f"{path}:{n}: not JSON ({e})") from None
  return rows
