"""Building a reward model from a config: its decoder and head, its choices, a backbone.

`build_reward_model` creates config.model's decoder with config.rm's scalar head, every
parameter in its shard; `load_backbone` copies a trained policy (config.rm.init_from)
into the decoder; `load_choice_splits` reads the choices file through its tfds builder.
"""

from __future__ import annotations

import dataclasses
import os
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from rlcode.parallel import sharding
from rlcode.data import sources
from rlcode.data.choices import Choice, ChoicesBuilder, load_choices
from rlcode.errors import BadInput, MissingInput
from rlcode.models.build import model_config
from rlcode.policy import policy_eval
from rlcode.rm.model import HeadConfig, RewardModel


def head_config(rm_cfg) -> HeadConfig:
  return HeadConfig(pooling=rm_cfg.pooling, hidden=rm_cfg.head_hidden,
                    features=tuple(rm_cfg.features))


def build_reward_model(model_cfg, rm_cfg, mesh: Mesh, seed: int) -> RewardModel:
  """The decoder of `model_cfg` (config.model) with the head of `rm_cfg` (config.rm),
  parameters created from `seed` in their shards."""
  if model_cfg.hf_path:
    raise BadInput("config.model.hf_path: reward models build config.model.arch (start "
                   "them from a policy with config.rm.init_from)")
  cfg, head = model_config(model_cfg), head_config(rm_cfg)
  return sharding.init_sharded(lambda: RewardModel(cfg, head, rngs=nnx.Rngs(seed)), mesh)


def load_choice_splits(data_cfg) -> dict[str, list[Choice]]:
  """{"train": ..., "eval": ...} of config.data (the train split cut to max_train_choices
  by a seeded permutation when that is set)."""
  path = sources.resolve(data_cfg.path)
  if not os.path.isfile(path):
    raise MissingInput(f"config.data.path={data_cfg.path!r}: no such choices file")
  import tensorflow_datasets as tfds
  tfds.disable_progress_bar()
  builder = ChoicesBuilder(data_dir=sources.data_dir(data_cfg), path=path,
                           held_out_fraction=data_cfg.held_out_fraction)
  train = load_choices(builder, data_cfg.train_split)
  if data_cfg.max_train_choices is not None:
    keep = np.random.default_rng(data_cfg.subset_seed).permutation(len(train))
    train = [train[i] for i in sorted(keep[:data_cfg.max_train_choices])]
  return {"train": train, "eval": load_choices(builder, data_cfg.eval_split)}


def load_backbone(model: RewardModel, path: str, recipe: policy_eval.Recipe,
                  mesh: Mesh) -> None:
  """Copies the policy at `path`, built by `recipe`, into the reward model's decoder (same
  ModelConfig)."""
  policy, _, _, _ = policy_eval.restore_policy(recipe, path, mesh)
  if policy.cfg != model.backbone.cfg:
    differ = [f.name for f in dataclasses.fields(policy.cfg)
              if getattr(policy.cfg, f.name) != getattr(model.backbone.cfg, f.name)]
    raise BadInput(f"config.rm.init_from={path!r}: the policy's model differs from "
                   f"config.model in {differ}")
  nnx.update(model.backbone, nnx.state(policy, nnx.Param))
