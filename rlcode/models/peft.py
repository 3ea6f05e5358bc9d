"""LoRA adapters in and out as a PEFT adapter directory (adapter_config.json and
adapter_model.safetensors), the format `peft.PeftModel.from_pretrained` loads onto its base.

PEFT names each adapted projection's matrices after the module, lora_A [rank, in] and
lora_B [out, rank], under "base_model.model."; its delta is lora_B lora_A x * alpha / r,
ours x A B * alpha / rank with A [in, rank] and B [rank, out]: the same numbers,
transposed, with the heads of q/k/v/o flattened as Hugging Face lays them out.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from rlcode.errors import BadInput, MissingInput
from rlcode.models.decoder import Decoder
from rlcode.models.hf import SafetensorsFile
from rlcode.models.lora import LoRAConfig

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
# Our target name -> (the HF module holding it, its projection's name).
MODULES = {"q": ("self_attn", "q_proj"), "k": ("self_attn", "k_proj"),
           "v": ("self_attn", "v_proj"), "o": ("self_attn", "o_proj"),
           "gate": ("mlp", "gate_proj"), "up": ("mlp", "up_proj"), "down": ("mlp", "down_proj")}
_OWNER = {"q": "attn", "k": "attn", "v": "attn", "o": "attn",
          "gate": "mlp", "up": "mlp", "down": "mlp"}


def _names(i: int, target: str) -> tuple[str, str]:
  module, proj = MODULES[target]
  base = f"base_model.model.model.layers.{i}.{module}.{proj}"
  return base + ".lora_A.weight", base + ".lora_B.weight"


def adapter_tensors(model: Decoder) -> dict[str, np.ndarray]:
  """PEFT's tensors of the model's adapters (host arrays)."""
  lora = model.cfg.lora
  if lora is None:
    raise BadInput("the model has no LoRA adapters (model.lora is not set)")
  model = model.looped()
  out = {}
  for i, block in enumerate(model.layers):
    for target in lora.targets:
      owner = getattr(block, _OWNER[target])
      adapter = getattr(owner, "lora_" + target, None)
      if adapter is None:  # NSA attention carries none
        continue
      a = np.asarray(jax.device_get(adapter.a[...]), np.float32)
      b = np.asarray(jax.device_get(adapter.b[...]), np.float32)
      a_name, b_name = _names(i, target)
      out[a_name] = np.ascontiguousarray(a.reshape(-1, lora.rank).T)
      out[b_name] = np.ascontiguousarray(b.reshape(lora.rank, -1).T)
  return out


def save_peft(model: Decoder, path: str, *, base_model: str = "") -> None:
  """Writes the model's adapters as a PEFT adapter directory (created) for the base
  checkpoint `base_model` (a Hub id or a directory, recorded as PEFT records it)."""
  lora = model.cfg.lora
  if model.cfg.family == "phi3":
    raise BadInput("a PEFT adapter names q/k/v and gate/up projections, which Phi-3 fuses; "
                   "export this run's merged weights instead")
  tensors = adapter_tensors(model)
  os.makedirs(path, exist_ok=True)
  config = {
      "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
      "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
      "target_modules": sorted(MODULES[t][1] for t in lora.targets), "bias": "none",
      "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
      "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
      "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}}
  with open(os.path.join(path, CONFIG), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  save_file(tensors, os.path.join(path, WEIGHTS), metadata={"format": "pt"})


def read_peft_config(path: str) -> LoRAConfig:
  """The LoRAConfig of a PEFT adapter directory; what we cannot represent is one line."""
  config_path = os.path.join(path, CONFIG)
  if not os.path.isfile(config_path):
    raise MissingInput(f"{path}: no {CONFIG}; not a PEFT adapter directory")
  try:
    with open(config_path, encoding="utf-8") as f:
      adapter = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise BadInput(f"{config_path}: not valid JSON ({e})") from None
  if adapter.get("peft_type") != "LORA":
    raise BadInput(f"{config_path}: peft_type={adapter.get('peft_type')!r}; only LORA is read")
  for flag in ("use_rslora", "use_dora", "fan_in_fan_out"):
    if adapter.get(flag):
      raise BadInput(f"{config_path}: {flag}=true is not supported")
  if adapter.get("rank_pattern") or adapter.get("alpha_pattern") or adapter.get("layers_to_transform"):
    raise BadInput(f"{config_path}: per-layer ranks, alphas or layer subsets are not supported")
  by_proj = {proj: t for t, (_, proj) in MODULES.items()}
  modules = adapter.get("target_modules") or []
  if isinstance(modules, str) or any(m not in by_proj for m in modules):
    raise BadInput(f"{config_path}: target_modules={modules!r}; supported: "
                   f"{sorted(by_proj)}")
  order = [t for t in MODULES if MODULES[t][1] in modules]
  return LoRAConfig(rank=int(adapter["r"]), alpha=float(adapter["lora_alpha"]),
                    dropout=float(adapter.get("lora_dropout", 0.0)), targets=tuple(order))


def load_peft(model: Decoder, path: str) -> Decoder:
  """`model` (built with the adapter's LoRAConfig) with the adapters of `path` in place."""
  expected = read_peft_config(path)
  lora = model.cfg.lora
  if lora is None or (lora.rank, lora.alpha, set(lora.targets)) != (
      expected.rank, expected.alpha, set(expected.targets)):
    raise BadInput(f"{path}: an adapter of rank {expected.rank}, alpha {expected.alpha} on "
                   f"{expected.targets} does not fit model.lora={lora}")
  weights = os.path.join(path, WEIGHTS)
  if not os.path.isfile(weights):
    raise MissingInput(f"{path}: no {WEIGHTS}")
  reader = SafetensorsFile(weights)
  graphdef, state = nnx.split(model)
  flat = dict(nnx.to_flat_state(state))
  p = len(model.layers) if model.cfg.scan_layers else None
  used = set()
  for i in range(model.cfg.num_layers):
    for target in lora.targets:
      a_name, b_name = _names(i, target)
      if a_name not in reader.header:
        continue
      used.update((a_name, b_name))
      owner = _OWNER[target]
      where = (("layers", i % p) if p else ("layers", i)) + (owner, "lora_" + target)
      for name, leaf in ((a_name, "a"), (b_name, "b")):
        var = flat[where + (leaf,)]
        shape = var.get_value().shape[1:] if p else var.get_value().shape
        raw = reader.get(name).astype(np.float32).T
        if raw.size != int(np.prod(shape)):
          raise BadInput(f"{weights}: tensor {name} has shape {raw.T.shape}, which does not "
                         f"fit the model's {shape}")
        value = raw.reshape(shape).astype(var.get_value().dtype)
        current = var.get_value()
        new = current.at[i // p].set(value) if p else jax.device_put(value, current.sharding)
        flat[where + (leaf,)] = var.replace(new)
  unused = sorted(set(reader.keys()) - used)
  if unused:
    raise BadInput(f"{weights}: tensors this model has no adapter for: {unused[:4]}")
  return nnx.merge(graphdef, nnx.from_flat_state(list(flat.items())))
