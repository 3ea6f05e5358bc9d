"""Figures as the experiment scripts save them: matplotlib on the Agg backend (files only,
no display), laid out tight and written at 110 dpi; and the seed scripts' validation
curve, one line a seed."""

from __future__ import annotations

import os


def pyplot():
  """matplotlib.pyplot, on the Agg backend."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def save(fig, folder: str, filename: str) -> str:
  """`fig` laid out tight and written to folder/filename at 110 dpi; returns that path."""
  fig.tight_layout()
  path = os.path.join(folder, filename)
  fig.savefig(path, dpi=110)
  return path


def seed_curves(found, key: str, *, ylabel: str, title: str, folder: str,
                filename: str) -> str:
  """A 6 x 4 inch figure of run[key] against run["val_steps"] ("GRPO step"), one line a
  run of `found` (labelled by its "seed"), saved by `save`; returns its path."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for r in found:
    ax.plot(r["val_steps"], r[key], marker="o", label=f"seed {r['seed']}")
  ax.set_xlabel("GRPO step")
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  return save(fig, folder, filename)
