"""What every RL loop holds of its policy: the graph, what is trained, the optimiser, the
reference, and the checkpoint bundle.

Full fine-tuning trains every parameter. With `model.lora` only the adapters are trained:
the optimiser state covers them alone, and the reference policy is the adapters' starting
values over the same frozen base (no second copy of the base). A checkpoint of a LoRA
run on a Hugging Face base (model.hf_path) holds the adapters and their optimiser state;
a resume loads the base again and puts the restored adapters on it. A model built from
scratch has its base trained by the warm start, which no config rebuilds: its
checkpoints hold the base too. The GRPO and agent loops build one `PolicyTraining` and
read the same things from it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx

from rlcode import optim
from rlcode.models import lora
from rlcode.runs import checkpoint


class PolicyTraining:
  """The trained policy's pieces: `graphdef`, the starting `params` (every parameter),
  `trainable` (the filter of what the optimiser trains), `optimizer`, and `frozen` (the
  params never trained: the base under LoRA, nothing otherwise)."""

  def __init__(self, model, optimizer_cfg, mesh, *, keeps_reference: bool,
               base_reloads: bool):
    """optimizer_cfg: config.optimizer. base_reloads: the base can be loaded again (the
    model came from a checkpoint, config.model.hf_path)."""
    self.graphdef, self.params = nnx.split(model, nnx.Param)
    self.cfg = model.cfg
    self.trainable = lora.trainable(model.cfg)
    opt = optim.OptimizerConfig.from_config(optimizer_cfg)
    self.optimizer, self.offload = optim.make_optimizer(opt), opt.offload
    self.mesh = mesh
    self.keeps_reference = keeps_reference
    # Checkpoints hold the adapters alone when the base can be loaded again.
    self.adapters_only = model.cfg.lora is not None and base_reloads
    # The frozen base as built; valid until the first step donates it (a resume reads it
    # before that).
    _, self.frozen = optim.split_trainable(self.params, self.trainable)

  @property
  def lora(self) -> bool:
    return self.cfg.lora is not None

  def model(self, params) -> Any:
    """The policy with `params` (every parameter)."""
    return nnx.merge(self.graphdef, params)

  def fresh(self, params) -> tuple[optim.TrainState, Any]:
    """(the train state, the reference) starting at `params`."""
    state = optim.init_state(self.model(params), self.optimizer, self.mesh, self.trainable,
                             self.offload)
    return state, self._reference(params)

  def _reference(self, params):
    if not self.keeps_reference:
      return {}
    part, _ = optim.split_trainable(params, self.trainable)
    return jax.tree.map(lambda x: x.copy(), part)  # the base, if frozen, is shared

  def reference_params(self, ref, state: optim.TrainState) -> nnx.State:
    """Every parameter of the reference policy: its stored trainable part over `state`'s
    frozen base (the arrays the latest update passed through; earlier ones were donated)."""
    if not self.lora:
      return ref
    return nnx.merge_state(ref, optim.split_trainable(state.params, self.trainable)[1])

  def bundle(self, state: optim.TrainState, ref) -> dict:
    """What a checkpoint holds: the train state (less the frozen base when it can be loaded
    again) and the reference."""
    if self.adapters_only:
      part, _ = optim.split_trainable(state.params, self.trainable)
      state = dataclasses.replace(state, params=part)
    return {"state": state, "ref": ref}

  def abstract_bundle(self) -> dict:
    state, _ = self.fresh(self.params)
    bundle = self.bundle(state, {})
    part, _ = optim.split_trainable(self.params, self.trainable)
    return {"state": checkpoint.abstract_like(bundle["state"]),
            "ref": checkpoint.abstract_like(part) if self.keeps_reference else {}}

  def from_bundle(self, restored: dict) -> tuple[optim.TrainState, Any]:
    """(train state, reference) of a restored `bundle`, the loaded base put back under the
    adapters when the checkpoint holds them alone."""
    state = restored["state"]
    if self.adapters_only:
      state = dataclasses.replace(state, params=nnx.merge_state(state.params, self.frozen))
    return state, restored["ref"]
