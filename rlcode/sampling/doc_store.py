"""A document KV store for "squid" (document) attention.

With document attention each packed document attends only to itself (its
positions restarting at 0), and the final segment, the query, attends to every
document and causally to itself. So a document's keys and values depend on the
document alone: they are computed once, cached by content hash, and composed
at query time. A query over documents D1..Dn prefills only the documents not
in the store, then runs the query against the concatenated cached KV (one
`Prefix`, attended non-causally) plus its own causal KV. Swapping one document
out of n recomputes that document only. Results equal a from-scratch prefill
of the packed sequence (tests/test_doc_store.py).

The store is a bounded LRU over bytes, in device memory or pinned host memory
(`memory`). Entries a query needs are never evicted while it runs; a query
whose documents alone exceed the budget is an error, not a silent truncation.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlcode.kernels.tiling import round_up
from rlcode.models.decoder import Decoder, Prefix

DOC_MULTIPLE = 64      # document lengths are padded to this for compute
PREFIX_MULTIPLE = 256  # composed prefix lengths are padded to this
QUERY_MULTIPLE = 16


@dataclasses.dataclass
class _Entry:
  k: tuple[jax.Array, ...]  # per layer [n, K, D]
  v: tuple[jax.Array, ...]
  length: int
  nbytes: int


@dataclasses.dataclass(frozen=True)
class QueryResult:
  logits: np.ndarray   # [Tq, V] float32, the query tokens' next-token logits
  computed: int        # documents prefilled for this query
  reused: int          # documents taken from the store


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _document_kv(state, tokens_1n, *, graphdef):
  model = nnx.merge(graphdef, state)
  _, kvs = model.hidden(tokens_1n)
  return tuple(k[0] for k, _ in kvs), tuple(v[0] for _, v in kvs)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _query(state, k_layers, v_layers, prefix_length, tokens_1t, *, graphdef):
  """k_layers/v_layers: per layer [S, K, D] (S padded); the query restarts at position 0."""
  model = nnx.merge(graphdef, state)
  prefix = Prefix(k=tuple(k[None] for k in k_layers), v=tuple(v[None] for v in v_layers),
                  lengths=jnp.reshape(prefix_length, (1,)))
  positions = jnp.arange(tokens_1t.shape[1], dtype=jnp.int32)[None]
  h, _ = model.hidden(tokens_1t, positions, prefix=prefix)
  return model.logits(h)[0]


class DocumentStore:
  """Per-document KV for a model whose layers are all document attention."""

  def __init__(self, model: Decoder, *, budget_bytes: int, memory: str = "device"):
    cfg = model.cfg
    if set(cfg.layer_kinds) != {"document"}:
      raise ValueError(f"DocumentStore needs every layer to be document attention (a "
                       f"document's KV must not depend on other documents); the model's "
                       f"layers are {cfg.layer_kinds}")
    if cfg.document_positions != "restart":
      raise ValueError("DocumentStore needs document_positions='restart': with positions that "
                       "continue, a document's keys depend on what precedes it")
    if memory not in ("device", "pinned_host"):
      raise ValueError(f"memory={memory!r}: expected 'device' or 'pinned_host'")
    if budget_bytes <= 0:
      raise ValueError(f"budget_bytes={budget_bytes} must be positive")
    self.graphdef, self.state = nnx.split(model.for_sampling())
    self.cfg = cfg
    self.budget_bytes = budget_bytes
    self.memory = memory
    self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
    self.stats = collections.Counter()

  @property
  def nbytes(self) -> int:
    return sum(e.nbytes for e in self._entries.values())

  def __len__(self) -> int:
    return len(self._entries)

  @staticmethod
  def key(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, np.int32).tobytes()).hexdigest()

  def __contains__(self, tokens: Sequence[int]) -> bool:
    return self.key(tokens) in self._entries

  def _compute(self, tokens: Sequence[int]) -> _Entry:
    n = len(tokens)
    padded = np.zeros((1, round_up(n, DOC_MULTIPLE)), np.int32)
    padded[0, :n] = tokens
    ks, vs = _document_kv(self.state, padded, graphdef=self.graphdef)
    # Right padding cannot change a causal document's own keys: keep the first n.
    ks, vs = tuple(k[:n] for k in ks), tuple(v[:n] for v in vs)
    if self.memory == "pinned_host":
      ks, vs = (tuple(jax.device_put(x, jax.memory.Space.Host) for x in xs) for xs in (ks, vs))
    nbytes = sum(x.nbytes for x in ks + vs)
    return _Entry(ks, vs, n, nbytes)

  def _make_room(self, nbytes: int, keep: set[str]) -> None:
    for key in list(self._entries):
      if self.nbytes + nbytes <= self.budget_bytes:
        return
      if key not in keep:
        del self._entries[key]
        self.stats["evictions"] += 1
    if self.nbytes + nbytes > self.budget_bytes:
      raise ValueError(f"the documents of one query need more than the store's budget of "
                       f"{self.budget_bytes} bytes")

  def query(self, documents: Sequence[Sequence[int]], query: Sequence[int]) -> QueryResult:
    """Logits of `query` after `documents` (in order), prefilling only what is missing."""
    if not documents or not query or any(len(d) == 0 for d in documents):
      raise ValueError("query needs at least one non-empty document and a non-empty query")
    total = sum(len(d) for d in documents) + len(query)
    if total > self.cfg.max_seq_len:
      raise ValueError(f"documents and query hold {total} tokens, more than the model's "
                       f"context of {self.cfg.max_seq_len}")
    keys = [self.key(d) for d in documents]
    needed = set(keys)
    computed = 0
    for key, doc in zip(keys, documents):
      if key in self._entries:
        self._entries.move_to_end(key)
        self.stats["hits"] += 1
        continue
      entry = self._compute(doc)
      self._make_room(entry.nbytes, keep=needed)
      self._entries[key] = entry
      self.stats["misses"] += 1
      computed += 1
    entries = [self._entries[k] for k in keys]
    length = sum(e.length for e in entries)
    pad = round_up(length, PREFIX_MULTIPLE) - length

    def compose(layer_parts):
      parts = [jax.device_put(x, jax.memory.Space.Device) if self.memory == "pinned_host"
               else x for x in layer_parts]
      return jnp.pad(jnp.concatenate(parts, axis=0), ((0, pad), (0, 0), (0, 0)))

    k_layers = tuple(compose([e.k[i] for e in entries]) for i in range(self.cfg.num_layers))
    v_layers = tuple(compose([e.v[i] for e in entries]) for i in range(self.cfg.num_layers))
    tokens = np.zeros((1, round_up(len(query), QUERY_MULTIPLE)), np.int32)
    tokens[0, :len(query)] = query
    logits = _query(self.state, k_layers, v_layers, jnp.int32(length), tokens,
                    graphdef=self.graphdef)
    return QueryResult(np.asarray(logits)[:len(query)], computed, len(documents) - computed)
