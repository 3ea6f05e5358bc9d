"""Orbax checkpoints of everything a run needs to resume to the same numbers.

One checkpoint holds the train state (params, optimizer state, step), the
frozen reference params when the KL term uses them, and a JSON record of the
loop's position: the RL step, how many tasks the data stream has consumed, and
the seeds every random draw derives from. Restoring places each array straight
into the sharding of the abstract state it is given.

A checkpoint whose files cannot be read back (a truncated array file, a metadata file
cut mid-write, a file missing) is `CorruptCheckpoint`, naming its step and the file;
a checkpoint of another model or optimiser is a plain BadInput saying so. The run
scaffold resumes from the newest intact checkpoint (rlcode.train.scaffold).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import traceback
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from rlcode.errors import BadInput, MissingInput
from rlcode.remote import require_filesystem


class CorruptCheckpoint(BadInput):
  """A checkpoint whose files cannot be read back; the message names the step and file."""


# What orbax and tensorstore say when the bytes of a checkpoint are not what they wrote.
_CORRUPT = ("DATA_LOSS", "OUT_OF_RANGE", "Error reading", "Error opening", "truncated",
            "Unexpected end")
_TENSORSTORE = re.compile(r'Error (?:reading|opening) "((?:state|ref)\.[^"]+)".*?at local file "([^"]+)"')


class Checkpointer:
  """A CheckpointManager over `directory` (local or gs://) keeping the last `keep`.

  On gs://, orbax lists, creates and renames the step directories and writes the JSON
  items through epath (so gcsfs), but writes and reads the arrays through tensorstore's
  own GCS driver, with its own client and credentials: no fsspec filesystem stands in for
  it, and no test here reaches a gs:// checkpoint's arrays.

  Close it when done (or use it as a context manager, which closes it also when a
  restore fails): an unclosed manager leaves orbax's background threads behind, and
  their errors at garbage collection land in whatever runs next."""

  def __init__(self, directory: str, keep: int = 2, create: bool = True):
    require_filesystem(directory, "checkpoint directory")
    # Orbax refuses relative local paths (at the first save, deep in a run).
    self.directory = epath.Path(directory if "://" in directory else os.path.abspath(directory))
    if not create and not self.directory.exists():
      raise MissingInput(f"no checkpoint under {directory}: no such directory")
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                             cleanup_tmp_directories=create),
        # Handlers named up front (not just item names), so that a manager that has not
        # saved can read a checkpoint's metadata (`_check_shapes`).
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "meta": ocp.JsonCheckpointHandler()})

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """The steps saved, newest first."""
    return sorted(self._manager.all_steps(), reverse=True)

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict, int]:
    """(state, meta, step) of `step` (default: the latest); arrays land in the
    shardings of `abstract_state` (a pytree of jax.ShapeDtypeStruct with sharding)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise MissingInput(f"no checkpoint in {self.directory}")
    self._check_manifests(step)
    self._check_shapes(step, abstract_state)
    # Installed before the restore: a failed read's siblings can report into the closed
    # loop while the first failure still unwinds.
    _quiet_late_reads_of_a_failed_restore(self.directory / str(step))
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    except Exception as e:  # noqa: BLE001 (orbax wraps tensorstore's errors in Exception)
      corrupt = self._corruption(step, e)
      if corrupt:
        raise CorruptCheckpoint(f"the checkpoint at step {step} in {self.directory} is "
                                f"corrupt: {corrupt}") from None
      if not isinstance(e, (ValueError, KeyError)):
        raise
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise BadInput(f"the checkpoint at step {step} in {self.directory} does not match the "
                     f"config's model and optimiser: {first[:300]}") from e
    return restored["state"], dict(restored["meta"]), step

  def _check_manifests(self, step: int) -> None:
    """CorruptCheckpoint when the array database of `step` cannot be listed (a manifest
    cut mid-write): found before orbax's restore, whose concurrent reads would fail one
    after another."""
    import tensorstore as ts
    base = self.directory / str(step) / "state"
    if not (base / "manifest.ocdbt").exists():
      return
    url = str(base) if "://" in str(base) else f"file://{base}"
    try:
      ts.KvStore.open({"driver": "ocdbt", "base": url.rstrip("/") + "/"}).result().list().result()
    except ValueError as e:
      raise CorruptCheckpoint(f"the checkpoint at step {step} in {self.directory} is corrupt: "
                              f"its array database cannot be read "
                              f"({str(e).splitlines()[0][:200]})") from None

  def _corruption(self, step: int, error: BaseException) -> str:
    """What is broken in the checkpoint at `step` when `error` says its bytes are not
    what was written ("" when it says something else)."""
    chain, seen = [], error
    while seen is not None and len(chain) < 20:
      chain.append(seen)
      seen = seen.__cause__ or seen.__context__
    for e in chain:
      found = _TENSORSTORE.search(str(e))
      if found:
        return f"array {found.group(1)} cannot be read from {found.group(2)}"
    if not any(isinstance(e, (json.JSONDecodeError, OSError)) or
               any(mark in str(e) for mark in _CORRUPT) for e in chain):
      return ""
    broken = _unreadable_json(self.directory / str(step))
    if broken:
      return f"{broken} is not valid JSON (cut mid-write?)"
    missing = next((e for e in chain if isinstance(e, FileNotFoundError)), None)
    if missing is not None:
      return f"a file is missing ({missing.filename or missing})"
    return f"{type(chain[-1]).__name__}: {str(chain[-1]).splitlines()[0][:200]}"

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
    # Pending work first (a save, the sweep of a crashed save's temporary directories,
    # which orbax awaits only at the next save): closing under a running operation
    # leaves a thread that fails at interpreter exit.
    self._manager.wait_until_finished()
    sweep = getattr(self._manager, "_maybe_await_cleanup_tmp_directory", None)
    if sweep is not None:
      sweep()
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _quiet_late_reads_of_a_failed_restore(step_dir: epath.Path) -> None:
  """Drop the late errors of a failed restore's other reads, and nothing else.

  Orbax runs a restore's reads on an event loop it closes as soon as one read fails; the
  reads still in flight then finish into the closed loop (tensorstore reports each as an
  unraisable "Event loop is closed"), and their coroutines, collected unfinished, raise
  as they are closed: tracebacks on stderr after the one line that names the corrupt
  file; asyncio logs the collected tasks' and futures' unread exceptions too. Every other
  unraisable goes to the hook there was, every other asyncio record to its handlers.
  """
  _RESTORED_STEP_DIRS.add(str(step_dir).rstrip("/") + "/")
  previous = sys.unraisablehook
  if getattr(previous, "_rlcode_quiet", False):
    return

  def late_read(unraisable) -> bool:
    if (isinstance(unraisable.exc_value, RuntimeError)
        and str(unraisable.exc_value) == "Event loop is closed"):
      return True
    code = getattr(unraisable.object, "cr_code", None)  # an orbax coroutine being closed
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename

  def hook(unraisable):
    if not late_read(unraisable):
      previous(unraisable)

  hook._rlcode_quiet = True
  sys.unraisablehook = hook

  # tensorstore reports a read that cannot hand its result to the closed loop with
  # PyErr_Print, which goes through sys.excepthook: drop exactly that traceback.
  previous_excepthook = sys.excepthook

  def excepthook(kind, value, tb):
    frames = traceback.extract_tb(tb) if tb is not None else []
    if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"
            and any(f.name == "call_soon_threadsafe" for f in frames)):
      previous_excepthook(kind, value, tb)

  sys.excepthook = excepthook
  # The failed reads' tasks and futures, collected with their exceptions unread, are
  # logged by asyncio.
  logging.getLogger("asyncio").addFilter(lambda record: not _late_read_record(record))


# The step directories restored in this process: the late errors of their reads, should
# a restore fail, are dropped.
_RESTORED_STEP_DIRS: set[str] = set()


def _late_read_record(record: logging.LogRecord) -> bool:
  """Whether an asyncio record is the unread exception of a failed restore's other read:
  a task in orbax's code, or an error that names a step directory being restored, in the
  record's message or anywhere in its exception's chain (orbax's "Encountered error while
  reading array index" names the file only in the tensorstore error it was raised from)."""
  message = record.getMessage()
  if (message.startswith(("Task exception was never retrieved",
                          "Future exception was never retrieved"))
      and f"{os.sep}orbax{os.sep}" in message):
    return True
  texts = [message]
  error = record.exc_info[1] if record.exc_info else None
  while error is not None and len(texts) < 16:
    texts.append(str(error))
    error = error.__cause__ or error.__context__
  return any(step_dir in text for text in texts for step_dir in _RESTORED_STEP_DIRS)


# The JSON files orbax writes into a step directory (local or gs://).
_JSON_FILES = ("_CHECKPOINT_METADATA", "meta/metadata", "state/_METADATA", "state/_sharding")


def _unreadable_json(step_dir: epath.Path) -> str:
  """The first JSON file of a step directory that does not parse, or ""."""
  for name in _JSON_FILES:
    path = step_dir / name
    if path.exists():
      try:
        json.loads(path.read_text())
      except (json.JSONDecodeError, UnicodeDecodeError):
        return str(path)
  return ""


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
