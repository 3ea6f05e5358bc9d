"""Where a checkpoint named by `model.hf_path` lives: a local directory or a Hub id.

"org/name" or "org/name@revision" that is not a local directory is fetched with
`huggingface_hub.snapshot_download` into its cache (HF_HOME / HF_HUB_CACHE, as every
Hugging Face tool shares it), only the files a decoder needs: config, safetensors,
tokenizer files, chat template, generation config. Offline (HF_HUB_OFFLINE=1, or no
network) a model already in the cache is used as it is; one that is not is one line
saying what to download and where. This module knows nothing of weights.
"""

from __future__ import annotations

import os
import re

from rlcode.errors import BadInput, MissingInput

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
# The files a checkpoint directory is read for (rlcode.models.hf, tokenizers, templates).
PATTERNS = ("*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.model", "*.txt")


def is_hub_id(path: str) -> bool:
  return bool(_HUB_ID.match(path)) and not os.path.exists(path.split("@")[0])


def resolve(path: str) -> str:
  """A local directory holding the checkpoint `path` names (itself if it is one)."""
  if os.path.isdir(path) or not is_hub_id(path):
    return path
  repo, _, revision = path.partition("@")
  from huggingface_hub import snapshot_download
  from huggingface_hub import errors
  offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
  try:
    return snapshot_download(repo, revision=revision or None, allow_patterns=list(PATTERNS),
                             local_files_only=offline)
  except errors.LocalEntryNotFoundError:  # offline, or the Hub unreachable, and not cached
    from huggingface_hub import constants
    raise MissingInput(
        f"model.hf_path {path!r}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) "
        f"and the Hub is {'switched off (HF_HUB_OFFLINE)' if offline else 'unreachable'}; "
        f"download it where there is a network (hf download {repo}"
        f"{' --revision ' + revision if revision else ''}) into that cache, or give a local "
        "directory") from None
  except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError,
          errors.GatedRepoError, errors.HFValidationError) as e:
    raise BadInput(f"model.hf_path {path!r}: {type(e).__name__}: "
                   f"{str(e).splitlines()[0]}") from None
