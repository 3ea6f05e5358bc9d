"""The config schema's device and policy sections: the mesh and the model.

rlcode.config.schema holds the rest; these are here so each file keeps one concern.
"""

from __future__ import annotations

import dataclasses

from rlcode.fields import Lazy, key
from rlcode.data.git.config import MiningConfig
from rlcode.swe.config import SweConfig
from rlcode.models.config import ModelConfig
from rlcode.models.lora import LoRAConfig

DTYPES = ("float32", "bfloat16", "float16")


def _mesh_size(n) -> bool:
  return n == -1 or n >= 1


@dataclasses.dataclass(frozen=True)
class Mesh:
  """The trainer's device mesh (rlcode.parallel.sharding).

  Attributes:
    data: data-parallel devices: batch rows split, parameters replicated; -1 takes every
      device the other axes leave.
    fsdp: fully sharded data-parallel devices: batch rows and parameters split; -1 as data.
    tensor: tensor-parallel devices: heads, MLP width and vocabulary split; -1 as data.
    context: context-parallel devices: each sequence split along its length, attention
      over all-gathered keys and values (rlcode.parallel.context); -1 as data.
    expert: expert-parallel devices: a mixture-of-experts layer's routed experts split,
      tokens gathered to them and their outputs reduce-scattered back (rlcode.models.moe);
      data-parallel outside those layers; -1 as data.
  """

  data: int = key(1, check=_mesh_size, allowed="-1 or >= 1")
  fsdp: int = key(1, check=_mesh_size, allowed="-1 or >= 1")
  tensor: int = key(1, check=_mesh_size, allowed="-1 or >= 1")
  context: int = key(1, check=_mesh_size, allowed="-1 or >= 1")
  expert: int = key(1, check=_mesh_size, allowed="-1 or >= 1")


@dataclasses.dataclass(frozen=True)
class Model:
  """The policy network (rlcode.models.build).

  Attributes:
    hf_path: a Hugging Face checkpoint to load: a directory, or a Hub id "org/name[@revision]"
      fetched into the Hugging Face cache (rlcode.models.hub); None builds `arch` from scratch.
    tokenizer: "bytes" or a tokenizer.json path, optionally ending in "+tools", "+edits" or
      "+digits" (rlcode.models.tokenizer); None: the checkpoint's own with hf_path, else bytes.
    param_dtype: the parameters' storage dtype.
    dtype: the compute dtype.
    attn_impl: the attention implementation (rlcode.kernels; "auto" picks per backend).
    remat: what each block keeps for the backward pass (rlcode.models.stack): "none",
      "full" (nothing but the block's input: the backward recomputes the block), "dots"
      (the matmul outputs without batch dims) or "offload" (those, in pinned host memory).
    scan_layers: stack the blocks' parameters on a `layers` axis and scan them (compile
      time and program size independent of depth; checkpoints of the two layouts differ).
    logits_chunk: positions per chunk of the output layer in training log-probs and
      cross-entropy; None: all at once (a [rows, tokens, vocab] float32 array).
    lora: low-rank adapters (rlcode.models.lora.LoRAConfig: rank, alpha, dropout,
      targets, base_dtype); only they are trained and checkpointed. None: full fine-tuning.
    arch: the architecture built from scratch (rlcode.models.ModelConfig's fields but the
      ones above); ignored with hf_path.
  """

  hf_path: str | None = key(None)
  tokenizer: str | None = key(None)
  param_dtype: str = key("float32", choices=DTYPES)
  dtype: str = key("float32", choices=DTYPES)
  attn_impl: str = key("auto", choices=Lazy("rlcode.kernels.dispatch", "IMPLS"))
  remat: str = key("none", choices=Lazy("rlcode.models.config", "REMAT_NAMES"))
  scan_layers: bool = key(False)
  logits_chunk: int | None = key(None, ge=1)
  lora: LoRAConfig | None = key(None)
  arch: ModelConfig | None = key(None)


# ModelConfig's fields that the model section holds instead of arch.
ARCH_EXCLUDED = {"param_dtype": "float32", "dtype": "float32", "attn_impl": "auto",
                 "remat": "none", "scan_layers": False, "logits_chunk": None, "lora": None}
# MiningConfig's source is config.data.repo; this stands in for it while checking.
MINING_EXCLUDED = {"source": "<config.data.repo>"}
EXCLUDED = {ModelConfig: ARCH_EXCLUDED, MiningConfig: MINING_EXCLUDED,
            SweConfig: MINING_EXCLUDED}
