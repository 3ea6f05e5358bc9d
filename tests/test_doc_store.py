"""The document KV store equals a from-scratch prefill of the packed documents."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlcode.sampling.doc_store import DocumentStore
from rlcode.models import Decoder, ModelConfig

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, qkv_bias=True, max_seq_len=512,
                  attention_pattern=("document",))


@pytest.fixture(scope="module")
def model():
  return Decoder(CFG, rngs=nnx.Rngs(0))


@functools.partial(jax.jit, static_argnums=0)
def _packed_logits(graphdef, state, tokens, segment_ids):
  return nnx.merge(graphdef, state)(tokens, segment_ids=segment_ids)


def _from_scratch(model, documents, query):
  tokens = sum(documents, []) + query
  seg = sum([[i] * len(d) for i, d in enumerate(documents)], []) + [len(documents)] * len(query)
  # One compiled shape: padding joins the query's (final) segment after it, where
  # causality keeps it from touching the query.
  pad = 256 - len(tokens)
  tokens, seg = tokens + [0] * pad, seg + [len(documents)] * pad
  logits = _packed_logits(*nnx.split(model), jnp.asarray([tokens]), jnp.asarray([seg]))
  end = sum(map(len, documents))
  return np.asarray(logits)[0, end:end + len(query)]


def _docs(seed, n, low=5, high=40):
  rng = np.random.default_rng(seed)
  return [rng.integers(1, 64, int(rng.integers(low, high))).tolist() for _ in range(n)]


@pytest.mark.slow
def test_query_equals_packed_prefill_and_swaps_recompute_one_document(model):
  store = DocumentStore(model, budget_bytes=1 << 24)
  docs, query = _docs(0, 5), [3, 4, 5, 6, 7]
  first = store.query(docs, query)
  assert (first.computed, first.reused) == (5, 0)
  np.testing.assert_allclose(first.logits, _from_scratch(model, docs, query), atol=2e-5)
  swapped = docs[:2] + _docs(1, 1) + docs[3:]
  second = store.query(swapped, query)
  assert (second.computed, second.reused) == (1, 4)
  np.testing.assert_allclose(second.logits, _from_scratch(model, swapped, query), atol=2e-5)
  reordered = store.query(swapped[::-1], query)
  assert reordered.computed == 0
  np.testing.assert_allclose(reordered.logits, second.logits, atol=2e-5)  # order-free


def test_host_memory_store_gives_the_same_logits(model):
  docs, query = _docs(2, 3), [9, 8, 7]
  device = DocumentStore(model, budget_bytes=1 << 24).query(docs, query)
  store = DocumentStore(model, budget_bytes=1 << 24, memory="pinned_host")
  host = store.query(docs, query)
  assert {x.sharding.memory_kind for e in store._entries.values() for x in e.k} == {"pinned_host"}
  np.testing.assert_allclose(host.logits, device.logits, atol=1e-6)


def test_lru_eviction_and_budget(model):
  docs = _docs(3, 4, low=30, high=31)  # four documents of 30 tokens
  per_doc = 2 * CFG.num_layers * 30 * CFG.num_kv_heads * CFG.head_dim * 4
  store = DocumentStore(model, budget_bytes=3 * per_doc)
  store.query(docs[:3], [1])
  store.query(docs[3:], [1])  # room for the fourth: the least recently used goes
  assert docs[0] not in store and all(d in store for d in docs[1:])
  assert store.stats["evictions"] == 1 and store.nbytes <= 3 * per_doc
  with pytest.raises(ValueError, match="more than the store's budget"):
    store.query(_docs(4, 4, low=30, high=31), [1])


def test_bad_input(model):
  with pytest.raises(ValueError, match="every layer to be document attention"):
    DocumentStore(Decoder(CFG.replace(attention_pattern=("dense",)), rngs=nnx.Rngs(0)),
                  budget_bytes=1 << 20)
  with pytest.raises(ValueError, match="restart"):
    DocumentStore(Decoder(CFG.replace(document_positions="continue"), rngs=nnx.Rngs(0)),
                  budget_bytes=1 << 20)
  store = DocumentStore(model, budget_bytes=1 << 20)
  with pytest.raises(ValueError, match="more than the model's context"):
    store.query([[1] * 400, [2] * 200], [3])
  with pytest.raises(ValueError, match="non-empty"):
    store.query([[]], [3])
