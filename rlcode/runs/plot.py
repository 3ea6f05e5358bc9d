"""`rlcode plot WORKDIR`: PNG curves of a workdir's metrics.jsonl, a panel per metric."""

from __future__ import annotations

import os
from collections.abc import Iterable

from rlcode.errors import BadInput
from rlcode.runs.metrics import METRICS_FILE, read_metrics

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
