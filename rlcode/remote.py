"""Remote paths: which schemes rlcode reads, and whether their filesystem is installed.

Remote inputs and outputs are `gs://bucket/...`, opened through etils.epath, which hands
them to fsspec's "gcs" filesystem: gcsfs, the `.[gcs]` extra (epath would use
tf.io.gfile instead were TensorFlow installed; rlcode does not install it). A gs://
checkpoint's arrays are the exception: orbax writes them through tensorstore's own GCS
driver (rlcode.runs.checkpoint). This module must not open anything, and imports nothing
of rlcode but its errors, so that every layer can call it.
"""

from __future__ import annotations

import fsspec

from rlcode.errors import BadInput

# scheme -> the fsspec protocol epath opens it with.
SCHEMES = {"gs": "gcs"}


def require_filesystem(path: str, what: str) -> None:
  """Nothing for a local `path`; for a remote one, raises BadInput (one line naming
  `what` and the path) unless it is gs:// and gcsfs is installed."""
  if "://" not in path:
    return
  scheme = path.split("://", 1)[0]
  if scheme not in SCHEMES:
    raise BadInput(f"{what} {path!r}: {scheme}:// is not read here; paths are local or "
                   "gs://")
  try:
    fsspec.get_filesystem_class(SCHEMES[scheme])
  except ImportError:
    raise BadInput(f"{what} {path!r}: gs:// paths are read through gcsfs, which is not "
                   "installed (pip install -e '.[gcs]')") from None
