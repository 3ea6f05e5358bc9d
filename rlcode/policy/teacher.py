"""The teacher of on-policy distillation (rl.distill_teacher, rlcode.rl.distill), on the
trainer's mesh.

rl.distill_teacher names a run's workdir or checkpoint directory (its recorded config
builds the model; `policy_eval.restore_policy` reads the latest checkpoint, a training
state or parameters alone, as `rlcode eval --checkpoint` does), or a Hugging Face
checkpoint (a directory whose config.json has a model_type, or a Hub id), built with the
student's model section but for the path (no adapters, the student's tokenizer when its
config names one). The teacher must share the student's tokenizer: the same vocabulary
size, padding and end tokens, and the same ids for a probe text; anything else is one line.
"""

from __future__ import annotations

import json
import os

import ml_collections
from flax import nnx

from rlcode.errors import BadInput, MissingInput
from rlcode.models import hub
from rlcode.models.build import build_model
from rlcode.policy import policy_eval

# Text whose ids two tokenizers must agree on (code, whitespace, digits, non-ASCII).
PROBE = "def f(x):\n\treturn [x + 1, 'é', 2024]  # ok\n"


def load(path: str | None, model_cfg, mesh, tokenizer, seed: int = 0):
  """(graphdef, params) of the teacher at `path` (rl.distill_teacher) on `mesh`; None when
  it is unset. A Hugging Face checkpoint is built as the student's model section
  (`model_cfg`, config.model) says, with `seed` for what the checkpoint does not hold; a
  run's directory as its recorded config says. `tokenizer` is the student's."""
  if not path:
    return None
  if _hugging_face(path):
    model_cfg = ml_collections.ConfigDict({**model_cfg.to_dict(), "hf_path": path,
                                           "lora": None})
    model, teacher_tokenizer = build_model(model_cfg, mesh, seed)
  else:
    if not os.path.exists(path):
      raise MissingInput(f"rl.distill_teacher={path!r} does not exist: name a run's workdir "
                         "or checkpoint directory, or a Hugging Face checkpoint")
    model, teacher_tokenizer, _, _ = policy_eval.restore_run(path, mesh, "rl.distill_teacher")
  differs = _tokenizer_difference(tokenizer, teacher_tokenizer)
  if differs:
    raise BadInput(f"rl.distill_teacher={path!r} does not share the student's tokenizer "
                   f"({differs}): its log-probs would be of other tokens")
  return nnx.split(model, nnx.Param)


def _hugging_face(path: str) -> bool:
  """Whether `path` is a Hugging Face checkpoint: a config.json with a model_type, or a
  Hub id that is not a local path."""
  cfg = os.path.join(path, "config.json")
  if os.path.isfile(cfg):
    with open(cfg, encoding="utf-8") as f:
      try:
        return "model_type" in json.load(f)
      except json.JSONDecodeError:
        return False
  return not os.path.exists(path) and hub.is_hub_id(path)


def _tokenizer_difference(student, teacher) -> str:
  """What differs between two tokenizers, in words; "" when nothing does."""
  for name in ("vocab_size", "pad_id", "eos_ids"):
    a, b = getattr(student, name), getattr(teacher, name)
    if name == "eos_ids":
      a, b = tuple(a), tuple(b)
    if a != b:
      return f"{name}: {a} (student) vs {b} (teacher)"
  if student.encode(PROBE) != teacher.encode(PROBE):
    return "the ids of a probe text"
  return ""
