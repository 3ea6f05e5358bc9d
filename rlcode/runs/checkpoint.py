"""Orbax checkpoints of everything a run needs to resume to the same numbers.

One checkpoint holds the train state (params, optimizer state, step), the
frozen reference params when the KL term uses them, and a JSON record of the
loop's position: the RL step, how many tasks the data stream has consumed, and
the seeds every random draw derives from. Restoring places each array straight
into the sharding of the abstract state it is given.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from rlcode.errors import BadInput, MissingInput


class Checkpointer:
  """A CheckpointManager over `directory` (local or gs://) keeping the last `keep`.

  Close it when done (or use it as a context manager, which closes it also when a
  restore fails): an unclosed manager leaves orbax's background threads behind, and
  their errors at garbage collection land in whatever runs next."""

  def __init__(self, directory: str, keep: int = 2):
    # Orbax refuses relative local paths (at the first save, deep in a run).
    self.directory = epath.Path(directory if "://" in directory else os.path.abspath(directory))
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             cleanup_tmp_directories=True),
        # Handlers named up front (not just item names), so that a manager that has not
        # saved can read a checkpoint's metadata (`_check_shapes`).
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "meta": ocp.JsonCheckpointHandler()})

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict, int]:
    """(state, meta, step) of `step` (default: the latest); arrays land in the
    shardings of `abstract_state` (a pytree of jax.ShapeDtypeStruct with sharding)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise MissingInput(f"no checkpoint in {self.directory}")
    self._check_shapes(step, abstract_state)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    except (ValueError, KeyError) as e:  # shapes or structure of another model/config
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise BadInput(f"the checkpoint at step {step} in {self.directory} does not match the "
                     f"config's model and optimiser: {first[:300]}") from e
    return restored["state"], dict(restored["meta"]), step

  def saved_shapes(self, step: int) -> list[tuple[int, ...]] | None:
    """The shapes of the arrays saved at `step`, sorted, from the checkpoint's metadata
    (None when it has none that can be read): what kind of tree a checkpoint holds,
    known before restoring it."""
    try:
      saved = self._manager.item_metadata(step)["state"]
      saved = getattr(saved, "tree", saved)
    except (KeyError, TypeError, AttributeError, ValueError):
      return None
    return None if saved is None else saved_shapes_of(saved)

  def _check_shapes(self, step: int, abstract_state: Any) -> None:
    """BadInput when the saved arrays' shapes are not the abstract state's (another model
    or config), read from the checkpoint's metadata before a restore starts: orbax's
    own check fails half way through, leaving coroutines and threads behind."""
    have = self.saved_shapes(step)
    if have is None:
      return  # no readable metadata: the restore itself still checks
    want = saved_shapes_of(abstract_state)
    if have != want:
      diff = next(((a, b) for a, b in zip(have, want) if a != b), None)
      detail = (f"first differing shape {diff[0]} saved, {diff[1]} expected" if diff
                else f"{len(have)} arrays saved, {len(want)} expected")
      raise BadInput(f"the checkpoint at step {step} in {self.directory} does not match the "
                     f"config's model and optimiser: {detail}")

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


# A run's warm-started policy: WORKDIR/warm_start, beside its rotating checkpoints/.
WARM_START = "warm_start"


def saved_shapes_of(tree: Any) -> list[tuple[int, ...]]:
  """The sorted array shapes of a pytree, as `Checkpointer.saved_shapes` gives them."""
  return sorted(tuple(getattr(x, "shape", ())) for x in jax.tree.leaves(tree))


def save_once(directory: str, step: int, tree: Any, meta: dict[str, Any]) -> None:
  """One checkpoint of `tree` in its own directory (a run's warm start), written before
  returning."""
  with Checkpointer(directory, keep=1) as ckpt:
    ckpt.save(step, tree, meta)
    ckpt.wait()


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs (with shardings) of a concrete pytree, for `restore`."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
      tree)


def bundle_like(state: Any, with_ref: bool) -> dict:
  """The abstract contents of a training checkpoint: the train state and, when the run
  keeps one, the frozen reference params ({} otherwise)."""
  return {"state": abstract_like(state), "ref": abstract_like(state.params) if with_ref else {}}
