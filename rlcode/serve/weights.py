"""Published policy versions: the learner writes them, the server swaps them in.

A version is one safetensors file `v{version:08d}.safetensors` in a directory (the online
run's workdir/published): every parameter by its dotted path. It is written to a
temporary name, flushed and renamed, so a reader sees a whole file or none. The server
polls the directory (`newest`), loads the newest version above its own onto its devices
(`load`) and hands it to the engine, which swaps it in between two decode steps. Older
versions than the newest `keep` are deleted by the writer.

Safetensors rather than an Orbax checkpoint: one file, no background threads, read in
milliseconds for the tiny policies; the learner's own checkpoints (for resuming) stay
Orbax ones (rlcode.train.scaffold). This module must not know about HTTP or training.
"""

from __future__ import annotations

import os
import re

import jax
import numpy as np
from flax import nnx

PATTERN = re.compile(r"^v(\d{8})\.safetensors$")


def _flat(state) -> dict[str, np.ndarray]:
  return {".".join(map(str, path)): np.asarray(jax.device_get(v.get_value()))
          for path, v in nnx.to_flat_state(state)}


def publish(directory: str, version: int, params, keep: int = 3) -> str:
  """Writes `params` (an nnx.State of Params) as version `version`; returns its path."""
  from safetensors.numpy import save_file
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"v{version:08d}.safetensors")
  tmp = path + f".tmp{os.getpid()}"
  save_file(_flat(params), tmp)
  with open(tmp, "rb") as f:
    os.fsync(f.fileno())
  os.replace(tmp, path)
  for old in versions(directory)[:-keep]:
    try:
      os.remove(os.path.join(directory, f"v{old:08d}.safetensors"))
    except FileNotFoundError:
      pass
  return path


def versions(directory: str) -> list[int]:
  """The versions published in `directory`, ascending ([] when it does not exist)."""
  if not os.path.isdir(directory):
    return []
  return sorted(int(m.group(1)) for name in os.listdir(directory)
                if (m := PATTERN.match(name)))


def newest(directory: str) -> int | None:
  found = versions(directory)
  return found[-1] if found else None


def load(directory: str, version: int, like):
  """Version `version` as an nnx.State shaped and placed like `like` (the sampling model's
  state); a file that lacks a parameter of `like`, or holds one of another shape, is an
  error naming it."""
  from safetensors.numpy import load_file
  arrays = load_file(os.path.join(directory, f"v{version:08d}.safetensors"))
  flat = []
  for path, var in nnx.to_flat_state(like):
    name = ".".join(map(str, path))
    if name not in arrays:
      raise ValueError(f"published version {version} lacks parameter {name}")
    value = var.get_value()
    if arrays[name].shape != value.shape:
      raise ValueError(f"published version {version}: {name} has shape "
                       f"{arrays[name].shape}, the served model's is {value.shape}")
    placed = jax.device_put(arrays[name].astype(value.dtype), value.sharding)
    flat.append((path, var.replace(placed)))
  return nnx.from_flat_state(flat)
