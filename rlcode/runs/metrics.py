"""Metrics: JSON lines in the workdir (the source of truth), TensorBoard events, PNG plots.

metrics.jsonl holds one object per training step and one per evaluation,
each with "step". On resume, rows after the restored step are dropped first,
so the file reads as if the run had never been interrupted; a fresh run never
touches an existing file (it refuses to start).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping

from rlcode.errors import BadInput, MissingInput

METRICS_FILE = "metrics.jsonl"


def _clean(value):
  if hasattr(value, "item"):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)  # JSON has no NaN/inf; keep them visible as strings
  return value


class MetricsWriter:
  """Appends rows to workdir/metrics.jsonl and mirrors scalars to TensorBoard.

  enabled=False (every process of a multi-process run but the first) touches no file:
  `write` only returns the row.
  """

  def __init__(self, workdir: str, *, resume_step: int | None = None, tensorboard: bool = True,
               enabled: bool = True):
    self.enabled = enabled
    self._tb = None
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, METRICS_FILE)
    if os.path.exists(self.path):
      if resume_step is None:
        raise BadInput(f"{self.path} exists but this run starts fresh (no checkpoint to "
                       "resume from): use another workdir, or delete the old run's files")
      rows = read_metrics(workdir)
      with open(self.path, "w") as f:
        for r in rows:
          if r["step"] <= resume_step:
            f.write(json.dumps(r) + "\n")
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, metrics: Mapping[str, object]) -> dict:
    row = {"step": int(step), **{k: _clean(v) for k, v in metrics.items()}}
    if not self.enabled:
      return row
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
    if self._tb is not None:
      for k, v in row.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(k, v, step)
    return row

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> list[dict]:
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.isfile(path):
    raise MissingInput(f"{path} does not exist: is {workdir!r} a training workdir?")
  rows = []
  with open(path) as f:
    for n, line in enumerate(f, 1):
      line = line.strip()
      if not line:
        continue
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise BadInput(f"{path}:{n}: not JSON ({e})") from None
  return rows


DEFAULT_PLOTS = ("eval/pass@1", "reward_mean", "pass_rate", "loss", "kl", "entropy")


def plot(workdir: str, keys: Iterable[str] = DEFAULT_PLOTS, out: str | None = None) -> str:
  """Writes one PNG with a panel per metric present in metrics.jsonl; returns its path."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = read_metrics(workdir)
  present = [k for k in keys if any(isinstance(r.get(k), (int, float)) for r in rows)]
  if not present:
    raise BadInput(f"{workdir}/{METRICS_FILE} has none of the metrics {list(keys)}")
  fig, axes = plt.subplots(len(present), 1, figsize=(7, 2.4 * len(present)), squeeze=False)
  for ax, key in zip(axes[:, 0], present):
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    xs, ys = zip(*pts)
    ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, markersize=3)
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
  axes[-1, 0].set_xlabel("step")
  fig.suptitle(os.path.basename(os.path.normpath(workdir)))
  fig.tight_layout()
  out = out or os.path.join(workdir, "metrics.png")
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out
