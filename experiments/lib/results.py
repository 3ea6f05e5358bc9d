"""Where results go: results/<topic>/<name>/, the payload beside a manifest of how it was made.

    results.write("grpo", "grpo_tiny_seeds", payload, config=config, files=[png])

writes results/grpo/grpo_tiny_seeds/result.json and manifest.json:

    {"commit": HEAD's sha, "dirty": whether tracked files outside results/ differ from it,
     "date": UTC ISO date, "command": the command line, "config": the resolved config (when
     given), "machine": {cpu, cores, memory_gib, load_average, jax, backend, devices},
     "files": the folder's files the manifest covers,
     "held_out_reads": every held-out read made for this result, earlier runs' first
     (experiments.lib.heldout), "held_out_after_change": one line per read of a design
     that the result's earlier reads did not have (absent when none)}

A held-out read belongs to the next result the process writes: that write takes every read
the process made since its previous write, and no later result gets them. A process that
makes two results reads for the first, writes it, then reads for the second.

A run's work folders (checkpoints, samples, the progress file a script resumes from) stay
under its --out (experiments/out/..., not tracked); only what a table is made of comes here.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import shlex
import shutil
import subprocess
import sys

from experiments.lib import ROOT

RESULTS = os.path.join(ROOT, "results")
MANIFEST = "manifest.json"
# This process's held-out reads not yet in a result (experiments.lib.heldout.record
# appends; `write` takes them): a read stamped into every later result would give a result
# that never used it a read of another design, and a false held_out_after_change.
HELD_OUT_READS: list[dict] = []


def folder(topic: str, name: str) -> str:
  """results/<topic>/<name>, made if absent."""
  path = os.path.join(RESULTS, topic, name)
  os.makedirs(path, exist_ok=True)
  return path


def write_json(obj, path: str) -> None:
  """Writes (rewrites) a JSON file whole or not at all, so a run cut short keeps the rows it
  finished."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


def write(topic: str, name: str, payload, *, config=None, command: str | None = None,
          files=(), into: str | None = None, filename: str = "result.json") -> str:
  """Writes `payload` to results/<topic>/<name>/<filename> and manifest.json beside it;
  returns the folder.

  config: the resolved config (a ConfigDict or a mapping) the run used. command: the
  command line (default: command_line()). files: paths of other files the run made (a
  figure, a log), copied into the folder unless already there. into: another folder to
  write to (the GPU check's run folder, where each part writes <part>.json); the manifest
  of a folder several writes share lists all their files.
  """
  where = into or folder(topic, name)
  os.makedirs(where, exist_ok=True)
  write_json(payload, os.path.join(where, filename))
  names = [filename]
  for path in files:
    target = os.path.join(where, os.path.basename(path))
    if os.path.abspath(path) != os.path.abspath(target):
      shutil.copyfile(path, target)
    names.append(os.path.basename(path))
  path, before = os.path.join(where, MANIFEST), {}
  if os.path.exists(path):
    with open(path) as f:
      before = json.load(f)
    names = sorted(set(before.get("files", [])) | set(names))
  taken = list(HELD_OUT_READS)
  write_json({**manifest(config=config, command=command), "files": names,
              **held_out_reads(before, os.path.relpath(where, ROOT), taken)}, path)
  # Only once the manifest holds them: a write that failed leaves them for the next.
  HELD_OUT_READS[:] = [r for r in HELD_OUT_READS if r not in taken]
  return where


def held_out_reads(before: dict, where: str, reads: list[dict]) -> dict:
  """The held-out keys of a result's manifest (module docstring): the reads of `before`
  (its manifest until now), then those of `reads` it does not hold; each read of a design
  none of the earlier reads had is flagged in one line, printed."""
  earlier = before.get("held_out_reads", [])
  seen = {r["id"] for r in earlier}
  new = [r for r in reads if r["id"] not in seen]
  if not earlier and not new:
    return {}
  flags = list(before.get("held_out_after_change", []))
  designs = sorted({r["design"] for r in earlier})
  # A result's first reads have nothing to differ from.
  fresh = {r["design"] for r in new} - set(designs) if earlier else set()
  for design in sorted(fresh):
    read = next(r for r in new if r["design"] == design)
    line = (f"held-out read after a change: {where} read {read['split']!r} of design "
            f"{design} at {read['commit'][:12]}; its {len(earlier)} earlier read(s), the "
            f"first {earlier[0]['date']} at {earlier[0]['commit'][:12]}, were of design(s) "
            f"{', '.join(designs)}: not a first look at this split")
    print(line, flush=True)
    flags.append(line)
  return {"held_out_reads": earlier + new, **({"held_out_after_change": flags} if flags else {})}


def manifest(*, config=None, command: str | None = None) -> dict:
  """The manifest of a result made now by this process (module docstring)."""
  out = {**git_state(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds"), "command": command or command_line()}
  if config is not None:
    out["config"] = plain_config(config)
  out["machine"] = machine()
  return out


def command_line() -> str:
  """This process's command: $RESULTS_COMMAND when a wrapper (gpu/check.sh) sets it, else
  sys.argv joined, as `python -m <module> ...` when run as a module."""
  if os.environ.get("RESULTS_COMMAND"):
    return os.environ["RESULTS_COMMAND"]
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None and spec.name:
    return shlex.join(["python", "-m", spec.name, *sys.argv[1:]])
  return shlex.join(sys.argv)


def plain_config(config) -> dict:
  """A config as JSON values (tuples become lists)."""
  as_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  return json.loads(json.dumps(as_dict, default=list))


@functools.cache
def git_state() -> dict:
  """{"commit": HEAD's sha, "dirty": tracked changes outside results/}, once a process;
  "unknown" and None where there is no git or no repository (a copied tree)."""
  def git(*args):
    """A git command's output in the repository root."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=60).stdout
  try:
    commit = git("rev-parse", "HEAD").strip()
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                     ":(exclude)results").strip())
  except (OSError, subprocess.SubprocessError):
    return {"commit": "unknown", "dirty": None}
  return {"commit": commit, "dirty": dirty}


def machine() -> dict:
  """The CPU model (/proc/cpuinfo), cores, memory, load average, and jax's version,
  backend and devices."""
  out = {"cpu": _cpuinfo("model name"), "cores": os.cpu_count(),
         "memory_gib": _memory_gib(), "load_average": list(os.getloadavg())}
  try:
    import jax
    out.update(jax=jax.__version__, backend=jax.default_backend(),
               devices=[str(d) for d in jax.devices()])
  except Exception as e:  # pylint: disable=broad-except  # no jax, or no backend: say so
    out["jax"] = f"unavailable: {type(e).__name__}: {e}"
  return out


def _cpuinfo(field: str) -> str:
  """The first /proc/cpuinfo line of `field`, or "unknown"."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith(field):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return "unknown"


def _memory_gib() -> float | None:
  """MemTotal of /proc/meminfo in GiB (None where it cannot be read)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return round(int(line.split()[1]) / 2 ** 20, 1)
  except OSError:
    pass
  return None
