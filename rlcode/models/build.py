"""From the `model` section of a config to a sharded Decoder and its tokenizer.

`config.model.hf_path` set: load that Hugging Face directory (its tokenizer.json
when present). Otherwise build `config.model.arch` from scratch with sharded
initialisation and the tokenizer `config.model.tokenizer` ("bytes" or a path).
"""

from __future__ import annotations

import os

from flax import nnx
from jax.sharding import Mesh

from rlcode import sharding
from rlcode.models.config import ModelConfig
from rlcode.models.decoder import Decoder
from rlcode.models.hf import load_hf
from rlcode.models.tokenizer import Tokenizer, load_tokenizer

_DTYPE_KEYS = ("param_dtype", "dtype", "attn_impl")


def model_config(model_cfg) -> ModelConfig:
  """The ModelConfig a from-scratch `config.model` describes."""
  fields = dict(model_cfg.arch)
  fields.update({k: model_cfg[k] for k in _DTYPE_KEYS if k in model_cfg})
  return ModelConfig(**fields)


def build_model(model_cfg, mesh: Mesh, seed: int) -> tuple[Decoder, Tokenizer]:
  overrides = {k: model_cfg[k] for k in _DTYPE_KEYS if k in model_cfg}
  if model_cfg.get("hf_path"):
    model, _ = load_hf(model_cfg.hf_path, mesh=mesh, **overrides)
    tok_path = model_cfg.get("tokenizer") or model_cfg.hf_path
    if tok_path != "bytes" and not os.path.isfile(os.path.join(tok_path, "tokenizer.json")):
      raise FileNotFoundError(f"{tok_path}: no tokenizer.json; set config.model.tokenizer")
    return model, load_tokenizer(tok_path)
  cfg = model_config(model_cfg)
  tokenizer = load_tokenizer(model_cfg.get("tokenizer", "bytes"))
  if tokenizer.vocab_size > cfg.vocab_size:
    raise ValueError(f"config.model.arch.vocab_size={cfg.vocab_size} is smaller than the "
                     f"tokenizer's vocabulary ({tokenizer.vocab_size})")
  model = sharding.init_sharded(lambda: Decoder(cfg, rngs=nnx.Rngs(seed)), mesh)
  return model, tokenizer
