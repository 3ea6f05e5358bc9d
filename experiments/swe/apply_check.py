"""Do the exported patches apply as SWE-bench's harness applies them?

For every instance of each SWE-bench JSON-lines file (`rlcode mine ... --tasks swe` writes
DIR/swe_tasks.jsonl), in a clone of its history: check out the base commit, `git apply`
the test patch, then the gold patch, and compare every file they touch with the tree the
reward's own path builds (rlcode.swe.tasks.evaluation_tree with the gold changes).
Counts the instances whose patches git applies and whose files then match.

Command (from the repository root):

  python -m experiments.swe.apply_check /tmp/swe/attrs/swe_tasks.jsonl /tmp/swe/mit/swe_tasks.jsonl

Prints a table; writes results/swe/NAME (default apply_check) with its manifest.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile

from experiments.lib import results, tables
from rlcode import paths
from rlcode.data.git.repo import checkout, git_env
from rlcode.swe import export, patches, tasks


def _git(cwd: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
  return subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True,
                        env=git_env(), check=False)


def check_file(path: str) -> dict:
  found = export.read(path)
  out = {"instances": len(found), "applied": 0, "matching": 0, "failures": []}
  if not found:
    return out
  with tempfile.TemporaryDirectory() as tmp:
    clone = os.path.join(tmp, "repo")
    bare = checkout(paths.resolve(found[0].extra.repo))
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", bare, clone],
                   check=True, env=git_env())
    for task in found:
      _git(clone, "checkout", "-q", "-f", task.extra.base_commit)
      _git(clone, "clean", "-q", "-f", "-d", "-x")
      failed = next((name for name, text in (("test_patch", task.extra.test_patch),
                                             ("patch", task.extra.patch))
                     if _git(clone, "apply", "-", stdin=text.encode()).returncode), None)
      if failed:
        out["failures"].append(f"{task.id}: git apply refused the {failed}")
        continue
      out["applied"] += 1
      base = tasks.base_files(task)
      want = tasks.evaluation_tree(base, task.extra.test_patch, tasks.gold_changes(task, base))
      touched = patches.paths(task.extra.test_patch) + patches.paths(task.extra.patch)
      wrong = [p for p in touched
               if (want.get(p) if os.path.exists(os.path.join(clone, p)) else None)
               != _read(os.path.join(clone, p))]
      if wrong:
        out["failures"].append(f"{task.id}: {wrong[0]} differs")
      else:
        out["matching"] += 1
  return out


def _read(path: str) -> str | None:
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8", newline="") as f:
    return f.read()


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("files", nargs="+", help="SWE-bench JSON-lines files")
  parser.add_argument("--name", default="apply_check")
  args = parser.parse_args(argv)
  payload, rows = {}, []
  for path in args.files:
    payload[path] = check_file(path)
    r = payload[path]
    rows.append([path, r["instances"], r["applied"], r["matching"]])
  table = tables.markdown(["file", "instances", "git apply takes both patches",
                           "files equal the reward's tree"], rows, "lrrr")
  print(table)
  payload["table"] = table
  print(results.write("swe", args.name, payload))


if __name__ == "__main__":
  main()
