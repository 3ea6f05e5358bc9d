"""The config a run records in its workdir (config.json), and the resume check against it.
"""

from __future__ import annotations

import json
import os
import ml_collections
from rlcode.config import loader
from rlcode.errors import MissingInput


def recorded_config(path: str, what: str = "path") -> ml_collections.ConfigDict:
  """The config a run was started with: config.json in `path` or the directory above it
  (a workdir's warm_start/ or checkpoints/)."""
  for where in (path, os.path.dirname(os.path.abspath(path))):
    candidate = os.path.join(where, loader.RUN_CONFIG)
    if os.path.isfile(candidate):
      with open(candidate) as f:
        return ml_collections.ConfigDict(json.load(f))
  raise MissingInput(f"{what}={path!r}: no {loader.RUN_CONFIG} there or one directory "
                     "up; name a run's workdir or checkpoint directory")
