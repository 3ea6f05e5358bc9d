"""`rlcode export WORKDIR --out DIR`: a trained policy as a Hugging Face directory.

The run's recorded config (WORKDIR/config.json) says what was trained; its latest
checkpoint is restored on one device and written as transformers reads it: config.json
(the family's own, rlcode.models.hf_config), model.safetensors (sharded past
--max-shard-gb), generation_config.json, and the tokenizer files: a checkpoint-based run
copies its base's (tokenizer.json, tokenizer_config.json with its chat template,
chat_template.jinja, special_tokens_map.json); a run from scratch on the byte tokenizer
gets a tokenizer.json that encodes as rlcode.models.ByteTokenizer does. A LoRA run
exports merged weights, or with --peft a PEFT adapter directory for its base instead.

The destination is checked before the checkpoint is restored (the slow part): it must be
a new or empty directory (made with its parents when missing) that can be listed and in
which a file can be written. Any OSError there, or while writing (a full disk, say), is
one line naming the path.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from rlcode.config import record
from rlcode.errors import BadInput
from rlcode.models import hf, hub
from rlcode.models import peft as peft_lib
from rlcode.models import tokenizer as tok_lib
from rlcode.parallel import sharding
from rlcode.policy import policy_eval

# What a checkpoint directory holds besides weights and config.json, copied as they are.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json")


def export(path: str, out: str, *, peft: bool = False, max_shard_gb: float | None = None,
           config=None) -> str:
  """Writes the latest policy under `path` (a workdir or checkpoint directory) to `out`;
  returns a one-line summary."""
  config = config or record.recorded_config(path, what="export")
  if config.trainer == "rm":
    raise BadInput(f"export {path!r}: a reward model's run; export writes policies")
  if peft and config.model.lora is None:
    raise BadInput(f"export --peft: {path!r} is not a LoRA run (model.lora is not set)")
  writable_destination(out)
  base = hub.resolve(config.model.hf_path) if config.model.hf_path else None
  recipe = policy_eval.Recipe.of(config.model, config.optimizer, config.rl, config.seed)
  model, tokenizer, step, _ = policy_eval.restore_policy(recipe, path, sharding.make_mesh())
  from safetensors import SafetensorError
  try:
    what = _write(model, tokenizer, config.model, base, out, peft, max_shard_gb)
  except (OSError, SafetensorError) as e:
    # safetensors reports a failed write (a full disk) as its own error, not an OSError.
    where = getattr(e, "filename", None) or out
    why = getattr(e, "strerror", None) or str(e).splitlines()[0][:200]
    raise BadInput(f"--out {out!r}: writing {where} failed ({why}); what was written "
                   "before it stays there: free space or fix permissions and export again "
                   "into an empty directory") from None
  return f"wrote {what} of step {step} to {out}"


def writable_destination(out: str) -> None:
  """Makes `out` (and its missing parents) and writes and removes a file in it; refuses a
  non-empty directory, a file, or a place where nothing can be listed or written, in one
  line."""
  try:
    entries = os.listdir(out) if os.path.isdir(out) else []
  except OSError as e:  # a directory this user may enter and write but not list
    raise BadInput(f"--out {out!r}: cannot list it ({e.strerror or e}), so cannot tell it "
                   "is empty; name a directory you can read and write") from None
  if entries:
    raise BadInput(f"--out {out!r} exists and is not empty; name a new directory")
  if os.path.exists(out) and not os.path.isdir(out):
    raise BadInput(f"--out {out!r} exists and is not a directory; name a new directory")
  try:
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryFile(dir=out):
      pass
  except OSError as e:
    raise BadInput(f"--out {out!r}: cannot write there ({e.strerror or e}"
                   f"{': ' + e.filename if e.filename and e.filename != out else ''}); "
                   "name a directory you can write") from None


def _write(model, tokenizer, model_cfg, base, out, peft, max_shard_gb) -> str:
  """The export's files in `out`; what was written, in words."""
  if peft:
    peft_lib.save_peft(model, out, base_model=model_cfg.hf_path or "")
    what = "a PEFT adapter"
  else:
    base_config = None
    if base is not None:
      with open(os.path.join(base, hf.CONFIG)) as f:
        base_config = json.load(f)
    shard = None if max_shard_gb is None else int(max_shard_gb * 2**30)
    hf.save_hf(model, out, base_config=base_config, max_shard_bytes=shard)
    what = f"a {model.cfg.family or 'Hugging Face'} checkpoint"
  _write_tokenizer(out, base, model_cfg.tokenizer, tokenizer)
  _write_generation_config(out, base, tokenizer)
  return what


def _write_tokenizer(out: str, base: str | None, named: str | None, tokenizer) -> None:
  """The base checkpoint's tokenizer files, or a tokenizer.json for the byte tokenizer."""
  if base is not None and not named:
    for name in TOKENIZER_FILES:
      src = os.path.join(base, name)
      if os.path.isfile(src):
        shutil.copy(src, os.path.join(out, name))
    return
  if isinstance(tokenizer, tok_lib.ByteTokenizer):
    tok_lib.byte_tokenizer_json(tokenizer, os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
      json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>",
                 "eos_token": "<eos>", "pad_token": "<pad>", "add_bos_token": tokenizer.add_bos,
                 "model_max_length": 1 << 20}, f, indent=2)
    return
  src = tok_lib.split_tokenizer_name(named)[0]
  src = src if os.path.isfile(src) else os.path.join(src, "tokenizer.json")
  shutil.copy(src, os.path.join(out, "tokenizer.json"))


def _write_generation_config(out: str, base: str | None, tokenizer) -> None:
  src = None if base is None else os.path.join(base, "generation_config.json")
  if src is not None and os.path.isfile(src):
    shutil.copy(src, os.path.join(out, "generation_config.json"))
    return
  eos = list(tokenizer.eos_ids)
  with open(os.path.join(out, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": eos[0] if len(eos) == 1 else eos,
               "pad_token_id": tokenizer.pad_id,
               "bos_token_id": getattr(tokenizer, "bos_id", None)}, f, indent=2)
