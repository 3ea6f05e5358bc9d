"""Hugging Face checkpoints in and out: config.json + safetensors (single or sharded).

Loading reads one tensor at a time into host memory (memory-mapped), converts
it to our layout and places it straight into its mesh sharding with
`jax.make_array_from_callback`, so no device holds a full copy of a sharded
parameter. Every tensor the model needs must be present with the shape the
config implies, and every tensor in the checkpoint must be used: a mismatch is
an error naming the file and the tensor, never a silent skip.

This module must not know about training or sampling.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors.numpy import save_file

from rlcode.errors import BadInput, MissingInput
from rlcode.parallel import sharding
from rlcode.models.config import ModelConfig
from rlcode.models.hf_config import from_hf_config, read_hf_config, to_hf_config
from rlcode.models import lora as lora_lib
from rlcode.models import stack
from rlcode.models.decoder import Decoder

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
# Buffers some exporters write that carry no parameters (recomputed from the config).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
              "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


class SafetensorsFile:
  """Memory-mapped reader for one .safetensors file (bfloat16 included)."""

  def __init__(self, path: str):
    self.path = path
    with open(path, "rb") as f:
      head = f.read(8)
      if len(head) != 8:
        raise BadInput(f"{path}: not a safetensors file (shorter than its 8-byte header size)")
      (n,) = struct.unpack("<Q", head)
      try:
        self.header = json.loads(f.read(n))
      except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: corrupt safetensors header: {e}") from e
    self.header.pop("__metadata__", None)
    self._offset = 8 + n
    self._data = np.memmap(path, dtype=np.uint8, mode="r")

  def keys(self):
    return self.header.keys()

  def get(self, name: str) -> np.ndarray:
    info = self.header[name]
    if info["dtype"] not in _ST_DTYPES:
      raise BadInput(f"{self.path}: tensor {name} has unsupported dtype {info['dtype']}")
    start, end = info["data_offsets"]
    raw = self._data[self._offset + start:self._offset + end]
    if raw.size != end - start:
      raise BadInput(f"{self.path}: tensor {name} is truncated (file too short)")
    return raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


@dataclasses.dataclass(frozen=True)
class _Entry:
  """How one of our parameters is made of Hugging Face tensors.

  hf_shapes(our_shape) gives the HF tensors' shapes, to_ours(*hf_arrays) builds
  ours, to_hf(ours) gives the HF arrays back (exact inverses).
  """

  ours: tuple[Any, ...]
  hf_names: tuple[str, ...]
  hf_shapes: Callable
  to_ours: Callable
  to_hf: Callable


def _mapping(cfg: ModelConfig) -> list[_Entry]:
  """Every parameter of the looped model of `cfg` as the Hugging Face tensors of its family
  (rlcode.models.hf_config), stacked for a scanned model."""
  if set(cfg.layer_kinds) - {"dense", "sliding"}:
    raise BadInput(f"Hugging Face checkpoints hold dense and sliding-window attention "
                   f"layers; this model's layers are {cfg.layer_kinds}")
  e, h, k, d, f = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                   cfg.intermediate_size)
  g = h // k
  fused = cfg.family == "phi3"  # q/k/v and gate/up as one tensor each
  one = lambda x: (x,)
  same = lambda x: x
  entries = [
      _Entry(("embed",), ("model.embed_tokens.weight",), one, same, one),
      _Entry(("final_norm", "scale"), ("model.norm.weight",), one, same, one)]
  if not cfg.tie_embeddings:
    entries.append(_Entry(("lm_head",), ("lm_head.weight",), lambda s: (s[::-1],),
                          lambda w: w.T, lambda x: (x.T,)))

  # q_proj [H*D, E], k_proj, v_proj [K*D, E] <-> qkv [E, K, G + 2, D].
  def qkv_to_ours(q, k_, v):
    return np.concatenate([q.T.reshape(e, k, g, d), k_.T.reshape(e, k, 1, d),
                           v.T.reshape(e, k, 1, d)], axis=2)

  def qkv_to_hf(x):
    return (x[:, :, :g].reshape(e, h * d).T, x[:, :, g].reshape(e, k * d).T,
            x[:, :, g + 1].reshape(e, k * d).T)

  # biases [H*D], [K*D], [K*D] <-> qkv_bias [K, G + 2, D].
  def bias_to_ours(q, k_, v):
    return np.concatenate([q.reshape(k, g, d), k_.reshape(k, 1, d), v.reshape(k, 1, d)], 1)

  def bias_to_hf(x):
    return x[:, :g].reshape(h * d), x[:, g].reshape(k * d), x[:, g + 1].reshape(k * d)

  def gated(width):
    """gate_proj, up_proj [F, E] <-> gate_up [E, 2, F] (Phi-3: one gate_up_proj [2F, E])."""
    if fused:
      return (lambda s: ((2 * width, e),), lambda w: w.T.reshape(e, 2, width),
              lambda x: (x.reshape(e, 2 * width).T,))
    return (lambda s: ((width, e), (width, e)), lambda gw, uw: np.stack([gw.T, uw.T], 1),
            lambda x: (x[:, 0].T, x[:, 1].T))

  norm_names = {"pre": (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")),
                "post": (("attn_post_norm", "post_attention_layernorm"),
                         ("mlp_post_norm", "post_feedforward_layernorm")),
                "sandwich": (("attn_norm", "input_layernorm"),
                             ("attn_post_norm", "post_attention_layernorm"),
                             ("mlp_norm", "pre_feedforward_layernorm"),
                             ("mlp_post_norm", "post_feedforward_layernorm"))}[cfg.norm_layout]
  for i in range(cfg.num_layers):
    p, hp = ("layers", i), f"model.layers.{i}."
    entries += [_Entry(p + (ours, "scale"), (hp + theirs + ".weight",), one, same, one)
                for ours, theirs in norm_names]
    attn = tuple(hp + f"self_attn.{n}_proj" for n in "qkv")
    if fused:
      entries.append(_Entry(
          p + ("attn", "qkv"), (hp + "self_attn.qkv_proj.weight",),
          lambda s: (((h + 2 * k) * d, e),),
          lambda w: qkv_to_ours(*np.split(w, [h * d, (h + k) * d])),
          lambda x: (np.concatenate(qkv_to_hf(x)),)))
    else:
      entries.append(_Entry(p + ("attn", "qkv"), tuple(n + ".weight" for n in attn),
                            lambda s: ((h * d, e), (k * d, e), (k * d, e)), qkv_to_ours,
                            qkv_to_hf))
    entries.append(_Entry(p + ("attn", "o"), (hp + "self_attn.o_proj.weight",),
                          lambda s: ((e, h * d),), lambda w: w.T.reshape(h, d, e),
                          lambda x: (x.reshape(h * d, e).T,)))
    if cfg.qkv_bias:
      entries.append(_Entry(p + ("attn", "qkv_bias"), tuple(n + ".bias" for n in attn),
                            lambda s: ((h * d,), (k * d,), (k * d,)), bias_to_ours, bias_to_hf))
    if cfg.qk_norm != "none":
      entries += [_Entry(p + ("attn", f"{n}_norm", "scale"), (hp + f"self_attn.{n}_norm.weight",),
                         one, same, one) for n in "qk"]
    if cfg.is_moe_layer(i):
      entries += _moe_entries(cfg, p, hp + "mlp.", gated)
      continue
    names = ((hp + "mlp.gate_up_proj.weight",) if fused else
             (hp + "mlp.gate_proj.weight", hp + "mlp.up_proj.weight"))
    entries += [
        _Entry(p + ("mlp", "gate_up"), names, *gated(f)),
        _Entry(p + ("mlp", "down"), (hp + "mlp.down_proj.weight",), lambda s: ((e, f),),
               lambda w: w.T, lambda x: (x.T,))]
  return _stacked(entries, cfg) if cfg.scan_layers else entries


def _moe_entries(cfg: ModelConfig, p: tuple, hp: str, gated) -> list[_Entry]:
  """A Qwen-MoE layer's router, experts (experts.{j}.{gate,up,down}_proj, [F', E] and
  [E, F']) stacked as [X, E, 2, F'] and [X, F', E], and its shared expert and gate."""
  moe, e = cfg.moe, cfg.hidden_size
  x, f = moe.num_experts, moe.intermediate_size
  experts = [f"{hp}experts.{j}." for j in range(x)]
  out = [
      _Entry(p + ("mlp", "router"), (hp + "gate.weight",), lambda s: ((x, e),),
             lambda w: w.T, lambda r: (r.T,)),
      _Entry(p + ("mlp", "experts_gate_up"),
             tuple(n for ex in experts for n in (ex + "gate_proj.weight", ex + "up_proj.weight")),
             lambda s: ((f, e),) * (2 * x),
             lambda *ws: np.stack([np.stack([ws[2 * j].T, ws[2 * j + 1].T], 1)
                                   for j in range(x)]),
             lambda a: tuple(w for j in range(x) for w in (a[j, :, 0].T, a[j, :, 1].T))),
      _Entry(p + ("mlp", "experts_down"), tuple(ex + "down_proj.weight" for ex in experts),
             lambda s: ((e, f),) * x, lambda *ws: np.stack([w.T for w in ws]),
             lambda a: tuple(a[j].T for j in range(x)))]
  if moe.shared_intermediate_size:
    fs = moe.shared_intermediate_size
    sp = hp + "shared_expert."
    out += [
        _Entry(p + ("mlp", "shared", "gate_up"), (sp + "gate_proj.weight", sp + "up_proj.weight"),
               *gated(fs)),
        _Entry(p + ("mlp", "shared", "down"), (sp + "down_proj.weight",), lambda s: ((e, fs),),
               lambda w: w.T, lambda a: (a.T,)),
        _Entry(p + ("mlp", "shared_gate"), (hp + "shared_expert_gate.weight",),
               lambda s: ((1, e),), lambda w: w.T, lambda a: (a.T,))]
  return out


def _stacked(entries: list[_Entry], cfg: ModelConfig) -> list[_Entry]:
  """The per-layer entries of a looped model as the scanned model's: one entry per
  parameter of each stack (rlcode.models.stack: stack j holds layers j, j + p, ...), its
  HF tensors those of its layers in order, converted layer by layer and stacked."""
  p = stack.period(cfg.block_kinds)
  out, groups = [], {}
  for entry in entries:
    if entry.ours[0] != "layers":
      out.append(entry)
      continue
    i, rest = entry.ours[1], entry.ours[2:]
    groups.setdefault((i % p, rest), []).append(entry)

  for (j, rest), group in groups.items():
    counts = [len(e.hf_names) for e in group]
    starts = np.cumsum([0] + counts)

    def hf_shapes(shape, group=group):
      return tuple(s for e in group for s in e.hf_shapes(shape[1:]))

    def to_ours(*raws, group=group, starts=starts):
      return np.stack([e.to_ours(*raws[starts[m]:starts[m + 1]]) for m, e in enumerate(group)])

    def to_hf(x, group=group):
      return tuple(a for m, e in enumerate(group) for a in e.to_hf(x[m]))

    out.append(_Entry(("layers", j, *rest), tuple(n for e in group for n in e.hf_names),
                      hf_shapes, to_ours, to_hf))
  return out


def _weight_files(path: str) -> dict[str, str]:
  """HF tensor name -> file holding it."""
  single, index = os.path.join(path, SINGLE), os.path.join(path, INDEX)
  if os.path.isfile(index):
    with open(index) as f:
      try:
        weight_map = json.load(f)["weight_map"]
      except (json.JSONDecodeError, KeyError) as e:
        raise BadInput(f"{index}: not a safetensors index (needs a 'weight_map'): {e}") from e
    files = {name: os.path.join(path, fname) for name, fname in weight_map.items()}
    missing = sorted({f for f in files.values() if not os.path.isfile(f)})
    if missing:
      raise MissingInput(f"{index} names shard files that are missing: {missing}")
    return files
  if os.path.isfile(single):
    return {name: single for name in SafetensorsFile(single).keys()}
  raise MissingInput(f"{path}: no {SINGLE} and no {INDEX}; not a complete "
                          "Hugging Face checkpoint directory")


def load_hf(path: str, *, mesh: Mesh | None = None, **config_overrides
            ) -> tuple[Decoder, ModelConfig]:
  """Loads a local Hugging Face Qwen2/Llama checkpoint directory.

  Args:
    path: directory with config.json and model.safetensors (or a sharded
      model.safetensors.index.json and its shard files).
    mesh: place each parameter in its sharding on this mesh; default: the
      default device.
    **config_overrides: ModelConfig fields to change, e.g. dtype="bfloat16".

  Returns:
    (model, config).
  """
  if not os.path.isdir(path):
    raise MissingInput(f"checkpoint directory {path!r} does not exist")
  config_path = os.path.join(path, CONFIG)
  if not os.path.isfile(config_path):
    raise MissingInput(f"{path}: missing {CONFIG}")
  cfg = from_hf_config(read_hf_config(config_path), source=config_path, **config_overrides)
  files = _weight_files(path)
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(abstract)
  flat = dict(nnx.to_flat_state(abstract_state))
  shardings = (dict(nnx.to_flat_state(sharding.state_shardings(abstract_state, mesh)))
               if mesh is not None else None)

  entries = _mapping(cfg)
  missing = [n for entry in entries for n in entry.hf_names if n not in files]
  if missing:
    raise BadInput(f"{path}: checkpoint lacks tensors the config needs: {missing[:8]}"
                     + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else ""))
  used = {n for entry in entries for n in entry.hf_names}
  unexpected = sorted(n for n in files if n not in used and not n.endswith(_IGNORED_SUFFIXES))
  if unexpected:
    raise BadInput(f"{path}: checkpoint has tensors this architecture does not use "
                     f"(config mismatch?): {unexpected[:8]}")

  readers: dict[str, SafetensorsFile] = {}
  values = []
  for entry in entries:
    var = flat[entry.ours]
    raws = []
    for hf_name, want in zip(entry.hf_names, entry.hf_shapes(var.get_value().shape)):
      fname = files[hf_name]
      reader = readers.setdefault(fname, SafetensorsFile(fname))
      if hf_name not in reader.header:
        raise BadInput(f"{fname}: the index says it holds {hf_name}, but it does not")
      raw = reader.get(hf_name)
      if tuple(raw.shape) != tuple(want):
        raise BadInput(f"{fname}: tensor {hf_name} has shape {tuple(raw.shape)}, "
                         f"but the config implies {tuple(want)}")
      raws.append(raw)
    host = np.ascontiguousarray(entry.to_ours(*raws).astype(var.get_value().dtype))
    ours = entry.ours
    if shardings is None:
      array = jax.device_put(host)
    else:
      array = jax.make_array_from_callback(host.shape, shardings[ours].get_value(),
                                           lambda idx, host=host: host[idx])
    values.append((ours, var.replace(array)))
  values += _fresh_adapters(flat, {e.ours for e in entries}, shardings)
  state = nnx.from_flat_state(values)
  return nnx.merge(graphdef, state), cfg


def _fresh_adapters(flat, loaded, shardings) -> list:
  """The LoRA adapters a checkpoint of the base does not hold, freshly initialised (A
  uniform in +-1/sqrt(fan in), B zero, as rlcode.models.lora.Adapter)."""
  out = []
  for n, (path, var) in enumerate(sorted(flat.items(), key=lambda kv: kv[0])):
    if path in loaded:
      continue
    if not isinstance(var, lora_lib.LoRAParam):
      raise RuntimeError(f"internal: the HF mapping does not cover {'/'.join(map(str, path))}")
    shape, dtype = var.get_value().shape, var.get_value().dtype
    stacked = var.get_metadata()["axes"][0] == "layers"
    if path[-1] == "a":
      fan_in = int(np.prod(shape[1 if stacked else 0:-1]))
      bound = 1.0 / np.sqrt(fan_in)
      make = lambda shape=shape, dtype=dtype, bound=bound, n=n: jax.random.uniform(
          jax.random.key(n), shape, dtype, -bound, bound)
    else:
      make = lambda shape=shape, dtype=dtype: jax.numpy.zeros(shape, dtype)
    sh = None if shardings is None else shardings[path].get_value()
    out.append((path, var.replace(jax.jit(make, out_shardings=sh)())))
  return out


def hf_tensors(model: Decoder) -> dict[str, np.ndarray]:
  """The model's parameters as Hugging Face named host arrays (LoRA adapters folded in)."""
  model = model.merged()
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  out = {}
  for entry in _mapping(model.cfg):
    arrays = entry.to_hf(np.asarray(jax.device_get(flat[entry.ours].get_value())))
    out.update({n: np.ascontiguousarray(a) for n, a in zip(entry.hf_names, arrays)})
  return out


def save_hf(model: Decoder, path: str, *, base_config: Mapping[str, Any] | None = None,
            max_shard_bytes: int | None = None) -> None:
  """Writes config.json and safetensors that transformers (and load_hf) read.

  Args:
    model: the decoder (scanned or looped; LoRA adapters are folded into the weights:
      rlcode.models.peft writes them as an adapter instead).
    path: output directory (created).
    base_config: a config.json dict whose fields we do not model are kept
      (for example the one the model was loaded from).
    max_shard_bytes: split the weights into shards of at most this size with a
      model.safetensors.index.json, as transformers does; default one file.
  """
  os.makedirs(path, exist_ok=True)
  model = model.merged()
  with open(os.path.join(path, CONFIG), "w") as f:
    json.dump(to_hf_config(model.cfg, base_config), f, indent=2, sort_keys=True)
  tensors = hf_tensors(model)
  if max_shard_bytes is None:
    save_file(tensors, os.path.join(path, SINGLE), metadata={"format": "pt"})
    return
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, arr in tensors.items():
    if shards[-1] and size + arr.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = arr
    size += arr.nbytes
  weight_map = {}
  for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(path, fname), metadata={"format": "pt"})
    weight_map.update({name: fname for name in shard})
  with open(os.path.join(path, INDEX), "w") as f:
    json.dump({"metadata": {"total_size": sum(a.nbytes for a in tensors.values())},
               "weight_map": weight_map}, f, indent=2, sort_keys=True)
