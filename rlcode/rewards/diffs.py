"""The SWE-RL diff-similarity reward (Wei et al. 2025, arXiv 2502.18449).

A completion is applied to the task's context files (rlcode.data.edits); any
format error scores -1. Otherwise the score is the mean, over every file that
the prediction or the oracle changes, of
`difflib.SequenceMatcher(None, pred, oracle, autojunk=False).ratio()` between
the two normalized per-file patches (unified diffs with 3 context lines and
the two header lines removed); a file only one side changes scores 0.

This follows facebookresearch/swe-rl, src/swerl/core/reward.py
(`calculate_search_replace_reward`, `calculate_reward`) step for step. The
deliberate differences:
- The unified-diff answer format is applied to the files like SEARCH/REPLACE
  edits and then scored by the same path, so only the diff's effect counts.
  SWE-RL's `calculate_reward_unidiff` instead compares the diff texts as
  written (parsed by `unidiff`) and never checks that they apply.
- An oracle that changes nothing is a data error here (ValueError); SWE-RL
  returns 1.0 when neither side changes anything. The miner never emits one.
- Files are visited in sorted order (SWE-RL iterates a set), so the float sum
  is deterministic.

This module must not build prompts or mine tasks; it reads a task's `extra`:
"files" (path -> context content), "oracle" (path -> content after the
change), "edit_format" and, for line edits that may leave the path out,
"open_file", and for line edits whose ranges count the shown lines, "shown_lines".
A diff task may also carry `tests`; mixing in the
tests reward is the registry's weighted sum, nothing here.

Tasks of other kinds are scored when their kind registers a view (`register_view`): a
function (task, completion) -> (files, oracle, predicted) or FormatError, imported on
first use from `_VIEW_MODULES` ("swe": rlcode.rewards.swe, a real repository's PR). This
module reads no field of theirs.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlcode.data import edits
from rlcode.data.tasks import Task
from rlcode.rewards.registry import RewardOutput, register

FORMAT_ERROR_SCORE = -1.0
# A completion whose similarity reaches this counts as a success in metrics.
SUCCESS_THRESHOLD = 0.9

# kind -> fn(task, completion) -> (files, oracle, predicted); raises edits.FormatError.
ViewFn = Callable[[Task, str], tuple[Mapping[str, str], Mapping[str, str], Mapping[str, str]]]
_VIEWS: dict[str, ViewFn] = {}
_VIEW_MODULES = {"swe": "rlcode.rewards.swe"}


def register_view(kind: str) -> Callable[[ViewFn], ViewFn]:
  """Declares how the diff reward sees a task of `kind` (module docstring)."""
  def wrap(fn: ViewFn) -> ViewFn:
    _VIEWS[kind] = fn
    return fn
  return wrap


def _view(kind: str) -> ViewFn | None:
  if kind not in _VIEWS and kind in _VIEW_MODULES:
    importlib.import_module(_VIEW_MODULES[kind])
  return _VIEWS.get(kind)


def _patches(files: Mapping[str, str], new: Mapping[str, str]) -> dict[str, str]:
  out = {}
  for path in sorted(new):
    patch = edits.normalized_patch(files.get(path, ""), new[path])
    if patch:
      out[path] = patch
  return out


def compare(files: Mapping[str, str], oracle: Mapping[str, str],
            predicted: Mapping[str, str]) -> tuple[dict[str, float], bool]:
  """(path -> similarity over the files either side changes, whether the prediction's
  normalized patches equal the oracle's: the same change, line terminators aside).

  Raises:
    ValueError: the oracle changes nothing the reward can see.
  """
  oracle_patches = _patches(files, oracle)
  if not oracle_patches:
    raise ValueError("the oracle changes nothing: every oracle file's "
                     "normalized patch against its context file is empty")
  pred_patches = _patches(files, predicted)
  out = {}
  for path in sorted(set(oracle_patches) | set(pred_patches)):
    pred, want = pred_patches.get(path, ""), oracle_patches.get(path, "")
    out[path] = (difflib.SequenceMatcher(None, pred, want, autojunk=False).ratio()
                 if pred and want else 0.0)
  return out, pred_patches == oracle_patches


def score_details(completion: str, files: Mapping[str, str],
                  oracle: Mapping[str, str], edit_format: str = "search_replace",
                  open_file: str = "", shown_lines: Mapping[str, Sequence[int]] | None = None
                  ) -> tuple[float, dict[str, Any]]:
  """The reward and why: {"error", "message"} or {"similarities", "exact"} (`compare`).
  open_file: the file of line edits that name none; shown_lines: the files' numbers of
  the lines a prompt shows, when its ranges count those (both edits.apply_completion)."""
  try:
    predicted = edits.apply_completion(completion, files, edit_format, open_file, shown_lines)
  except edits.FormatError as e:
    return FORMAT_ERROR_SCORE, {"error": e.code, "message": str(e)}
  sims, exact = compare(files, oracle, predicted)
  return sum(sims.values()) / len(sims), {"similarities": sims, "exact": exact}


def score(completion: str, files: Mapping[str, str], oracle: Mapping[str, str],
          edit_format: str = "search_replace") -> float:
  """SWE-RL's reward of `completion` on context `files` against `oracle`.

  Args:
    completion: the policy's text (<think>...</think><solution>...</solution>).
    files: path -> content the completion edits.
    oracle: path -> content after the true change (changed files only, or all).
    edit_format: "search_replace" or "unified_diff".

  Returns:
    -1.0 on a format error, else the mean per-file similarity in [0, 1].
  """
  return score_details(completion, files, oracle, edit_format)[0]


def _viewed_score(view: ViewFn, task: Task, completion: str) -> tuple[float, dict[str, Any]]:
  try:
    files, oracle, predicted = view(task, completion)
  except edits.FormatError as e:
    return FORMAT_ERROR_SCORE, {"error": e.code, "message": str(e)}
  sims, exact = compare(files, oracle, predicted)
  return sum(sims.values()) / len(sims), {"similarities": sims, "exact": exact}


@register("diff")
def diff_reward(tasks: Sequence[Task], completions: Sequence[str]) -> RewardOutput:
  """`score` for each (task, completion) of a batch of diff tasks.

  Metrics (fractions of the batch's completions unless said otherwise):
  format_valid (the answer parses and applies), reward_mean (the mean score,
  format errors at -1 included), exact (the same change as the oracle:
  `compare`), success_rate (score >= SUCCESS_THRESHOLD) and similarity (the
  mean score of the valid answers; 0 when none is).
  """
  if len(tasks) != len(completions):
    raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
  scores = np.zeros(len(completions), np.float32)
  details = []
  for i, (task, completion) in enumerate(zip(tasks, completions)):
    view = _view(task.kind) if task.kind != "diff" else None
    if view is not None:
      s, detail = _viewed_score(view, task, completion)
      scores[i] = s
      details.append(detail)
      continue
    if task.kind != "diff":
      raise ValueError(f"task {task.id!r} has kind {task.kind!r}; the diff reward needs "
                       f"kind 'diff' or one of {sorted(set(_VIEWS) | set(_VIEW_MODULES))}")
    if not task.extra.oracle:
      raise ValueError(f"task {task.id!r}: extra.oracle is empty (no real change to score by)")
    s, detail = score_details(completion, task.extra.files, task.extra.oracle,
                              task.extra.edit_format, task.extra.open_file,
                              task.extra.shown_lines)
    scores[i] = s
    details.append(detail)
  is_valid = np.array(["error" not in d for d in details], bool)
  valid = scores[is_valid]
  n = max(len(scores), 1)
  metrics = {
      "format_valid": float(is_valid.sum()) / n,
      "reward_mean": float(scores.sum()) / n,
      "exact": sum(bool(d.get("exact")) for d in details) / n,
      "success_rate": float(np.sum(scores >= SUCCESS_THRESHOLD)) / n,
      "similarity": float(valid.mean()) if len(valid) else 0.0,
  }
  return RewardOutput(scores, metrics, details)
