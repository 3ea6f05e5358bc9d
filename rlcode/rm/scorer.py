"""A trained reward model, restored from its workdir, scoring (prompt, completion) pairs.

The workdir's config.json (written by `rlcode train-rm`) rebuilds the model; the latest
checkpoint under workdir/checkpoints (or the directory itself) gives its weights. Scoring
runs on one device in fixed-size jitted batches. This module must not train or choose.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from rlcode.runs import checkpoint
from rlcode.parallel import sharding
from rlcode import optim
from rlcode.errors import MissingInput
from rlcode.models.tokenizer import load_tokenizer
from rlcode.rm import features as features_lib
from rlcode.rm.batch import pair_rows
from rlcode.rm.build import build_reward_model
from rlcode.config.record import recorded_config


class RewardModelScorer:
  """`scorer.score(prompts, completions, features=None)` -> float32 scores [N].

  Args:
    path: a reward model's workdir or its checkpoints/ directory.
    rows: pairs per jitted call (the last call is padded).
  """

  def __init__(self, path: str, rows: int = 64):
    self.path = path
    self.config = recorded_config(path, "reward model checkpoint")
    mesh = sharding.make_mesh(1, 1, 1)
    model = build_reward_model(self.config.model, self.config.rm, mesh, self.config.seed)
    nested = os.path.join(path, "checkpoints")
    with checkpoint.Checkpointer(nested if os.path.isdir(nested) else path,
                               create=False) as ckpt:
      if ckpt.latest_step() is None:
        raise MissingInput(f"reward model checkpoint {path!r}: no checkpoint there")
      optimizer = optim.make_optimizer(optim.OptimizerConfig.from_config(self.config.optimizer))
      restored, _, self.step = ckpt.restore(
          {"state": checkpoint.abstract_like(optim.init_state(model, optimizer, mesh))})
    graphdef, _ = nnx.split(model, nnx.Param)
    self.params = restored["state"].params
    self.features = tuple(self.config.rm.features)
    self.tokenizer = load_tokenizer(self.config.model.tokenizer or "bytes")
    self.max_len = model.backbone.cfg.max_seq_len
    self.rows = rows

    @jax.jit
    def run(params, tokens, start, length, feats):
      with sharding.activate(mesh):
        model = nnx.merge(graphdef, params)
        return model(tokens, start, length, feats if self.features else None)
    self._run = run

  def score(self, prompts: Sequence[str], completions: Sequence[str],
            features: np.ndarray | None = None) -> np.ndarray:
    """Scores of N pairs; `features` [N, F] in the order of self.features when the model
    takes any."""
    n = len(completions)
    if len(prompts) != n:
      raise ValueError(f"{len(prompts)} prompts but {n} completions")
    if self.features and (features is None or np.shape(features) != (n, len(self.features))):
      got = None if features is None else np.shape(features)
      raise ValueError(f"the reward model takes features {self.features}: give [{n}, "
                       f"{len(self.features)}], got {got}")
    feats = (np.zeros((n, 0), np.float32) if features is None
             else np.asarray(features, np.float32))
    out = []
    for i in range(0, n, self.rows):
      idx = list(range(i, min(i + self.rows, n)))
      idx += [idx[0]] * (self.rows - len(idx))
      tokens, start, length, _ = pair_rows(self.tokenizer, [prompts[j] for j in idx],
                                           [completions[j] for j in idx], self.max_len)
      scores = self._run(self.params, tokens, start, length, feats[idx])
      out.append(np.asarray(scores)[:min(self.rows, n - i)])
    return np.concatenate(out).astype(np.float32) if out else np.zeros((0,), np.float32)


@functools.lru_cache(maxsize=4)
def load(path: str) -> RewardModelScorer:
  """One scorer per checkpoint path for the life of the process (rewards call it often)."""
  return RewardModelScorer(path)


def selection_scorer(path: str):
  """Selection by reward model (rlcode.evaluation.selection_eval's `rm_scores`): the model
  at `path`, loaded when first asked, scoring each sample's shown code after its prompt."""
  def scores(row_tasks, texts, stop_sequences, workers) -> list[float]:
    rm = load(path)
    shown = [features_lib.shown_code(t, c, stop_sequences) for t, c in zip(row_tasks, texts)]
    feats = (features_lib.compute(row_tasks, texts, rm.features, stop_sequences=stop_sequences,
                                  workers=workers) if rm.features else None)
    return [float(s) for s in rm.score([t.prompt for t in row_tasks], shown, feats)]
  return scores
