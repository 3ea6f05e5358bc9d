"""From the `model` section of a config to a sharded Decoder and its tokenizer.

`config.model.hf_path` set: load that Hugging Face checkpoint (a directory, or a Hub id
"org/name[@revision]" fetched into the Hugging Face cache: rlcode.models.hub), with its
own tokenizer.json unless `config.model.tokenizer` names one ("bytes" or a path). Otherwise
build `config.model.arch` from scratch with sharded initialisation and the tokenizer
`config.model.tokenizer` ("" or "bytes": the byte-level one; or a path). Either name may
end with "+tools" (the tool-calling tags as single tokens) or "+edits" (the edit
answers' markers): rlcode.models.tokenizer.load_tokenizer. A tokenizer with more tokens
than the model's vocabulary is an error.
"""

from __future__ import annotations

import os

from flax import nnx
from jax.sharding import Mesh

from rlcode.parallel import sharding
from rlcode.errors import BadInput, MissingInput
from rlcode.models.config import ModelConfig
from rlcode.models.decoder import Decoder
from rlcode.models import hub
from rlcode.models.hf import load_hf
from rlcode.models.tokenizer import (Tokenizer, is_byte_tokenizer, load_tokenizer,
                                     split_tokenizer_name)

# The model section's keys that override a checkpoint's (or fill the arch's) ModelConfig.
MODEL_KEYS = ("param_dtype", "dtype", "attn_impl", "remat", "scan_layers", "logits_chunk",
              "lora")


def model_overrides(model_cfg) -> dict:
  """The ModelConfig fields the model section sets (MODEL_KEYS), as plain values."""
  out = {k: model_cfg[k] for k in MODEL_KEYS if k in model_cfg}
  if hasattr(out.get("lora"), "to_dict"):
    out["lora"] = out["lora"].to_dict()
  return out


def model_config(model_cfg) -> ModelConfig:
  """The ModelConfig a from-scratch `config.model` describes (its arch, with the model
  section's dtypes and attention implementation)."""
  if model_cfg.arch is None:
    raise BadInput("config.model.arch is not set: give the architecture to build, or "
                   "config.model.hf_path to load")
  arch = model_cfg.arch.to_dict() if hasattr(model_cfg.arch, "to_dict") else dict(model_cfg.arch)
  return ModelConfig(**arch, **model_overrides(model_cfg))


def build_model(model_cfg, mesh: Mesh, seed: int) -> tuple[Decoder, Tokenizer]:
  """The policy and its tokenizer of a config's `model` section."""
  named = model_cfg.tokenizer or ""
  if model_cfg.hf_path:
    path = hub.resolve(model_cfg.hf_path)
    model, _ = load_hf(path, mesh=mesh, **model_overrides(model_cfg))
    # A checkpoint brings its own tokenizer unless the config names one.
    tok_path = named or path
    base = split_tokenizer_name(tok_path)[0]
    if not is_byte_tokenizer(tok_path) and not (
        os.path.isfile(base) or os.path.isfile(os.path.join(base, "tokenizer.json"))):
      raise MissingInput(f"{tok_path}: no tokenizer.json; name one with "
                         "config.model.tokenizer")
    tokenizer = load_tokenizer(tok_path)
    where = f"the checkpoint {model_cfg.hf_path!r}"
  else:
    tokenizer = load_tokenizer(named or "bytes")
    model = sharding.init_sharded(lambda: Decoder(model_config(model_cfg), rngs=nnx.Rngs(seed)),
                                  mesh)
    where = "config.model.arch"
  if tokenizer.vocab_size > model.cfg.vocab_size:
    raise BadInput(f"the tokenizer ({named or 'bytes'!r} -> {tokenizer.vocab_size} tokens) does "
                   f"not fit {where}, whose vocabulary has {model.cfg.vocab_size} entries")
  return model, tokenizer
