"""Writes data/agent_tasks.jsonl: tasks a tiny policy can solve only through its tools.

Each task asks for solution.py with one small function of x. What the function
needs is not in the prompt:
  file    the constant is in a named workspace file ("OFFSET = 7" in config.txt,
          sometimes below an unrelated line); the prompt names the file.
  search  the constant is in one of three files; the prompt does not say which.
  tests   the function's name is only in the output of the first failing test
          run (the workspace holds a stub solution.py; the tests call the name).
A policy that does not look cannot do better than a guess. The prompt gives the
operation (plus, minus, times) in words; the tests are assert statements on fixed
inputs (hidden: six; visible, what run_tests runs: two).

Splits by a hash of the unit: (operation, constant, symbol) for file and search
tasks, (operation, name) for tests tasks; held_out with probability 0.2, validation
0.15, else train. A held-out task's unit never appears in training; its phrasing,
file names and symbols do, and so does its prompt, word for word, with other
constants (file, search) or other names (tests): the prompt cannot tell the answer.
Until 2026-12-01 the file and search unit was (operation, constant). Then each
constant came with only one or two operations in training, and the held-out split
asked for a pairing the training split never showed; a tiny policy learnt that
rule (it wrote "+" for "minus" whenever the constant had only come with "plus")
instead of reading the operation in the prompt.

Practice tasks (training only, ids agent/practice/...): the same three variants on
units no split uses: for file and search, eight other symbols (WIDTH, COUNT, ...) with
constants 2-99; for tests, made-up names ("rutek7"), each with a random operation. So
many pairings, each seen once, cannot be memorised: fitting them means reading the
prompt and copying from the tools' output, and a warm start on them learns to copy
(docs/journal.md, agent_tiny: 0.911 of validation episodes reproduced greedily
after 600 steps, against 0.018 with practice constants 10-99 on the task symbols).
Until 2026-12-01 the practice names were the task stems with digits 4-9; the policy
then wrote a remembered name for about half of the validation tests tasks ("plom3"
for "frob3"). With made-up names it still does after the 600-step warm start (tests
tasks 0.500 at T=1): reading the name from the test output is learnt last.

    python data/make_agent_tasks.py     # rewrites data/agent_tasks.jsonl deterministically
    python data/make_agent_tasks.py --decoys    # data/agent_tasks_decoy.jsonl (below)
    python data/make_agent_tasks.py --notes     # data/agent_tasks_notes.jsonl (below)

With --decoys every file and search task but the practice ones also holds its symbol's
old value, commented out: "# OFFSET = 4" beside "OFFSET = 7" in the named file (in a
random order), or in another of the three files of a search task, so that the search
finds both. The tasks, their splits and their references are the others' exactly; the
hint records the decoy's value. The tests pass only with the live value, so a policy
must copy from the right line, which a demonstrator that does not tell the two apart
(rlcode.agent.expert.copies_decoy, agent.decoy_copy) gets right half the time:
imitating it cannot teach the difference, the reward could. (In 30 or 50 GRPO steps it
did not: docs/journal.md, agent_tiny, "decoy lines".)

With --notes every task but the practice ones ends its prompt with a stale note: "An
old note says OFFSET = 4." (file and search tasks: another constant 2-9) or "An old
note calls it frob2." (tests tasks: another name of the same pool). The note is never
right, and the tasks, splits, workspaces and tests are the others' exactly; the hint
records the note's value. A demonstrator that trusts the note on some tasks
(rlcode.agent.expert.trusts_note, agent.note_trust) writes solution.py from it at
once, without looking, and fails; on the others it looks, as the expert does.
Imitating it teaches looking on only part of the tasks; the reward tells which of
the two pays.

`extra` carries what the scripted expert (rlcode.agent.expert) needs: the
variant, the file and symbol to look up, and the reference solution.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random

OPS = {"add": ("+", "plus"), "sub": ("-", "minus"), "mul": ("*", "times")}
SYMBOLS = ("OFFSET", "STEP", "SCALE", "LIMIT")
PRACTICE_SYMBOLS = ("WIDTH", "COUNT", "DEPTH", "RATE", "SIZE", "BASE", "SHIFT", "FACTOR")
FILES = ("config.txt", "notes.txt", "settings.ini", "values.txt")
NOISE = ("mode = fast", "version = 2", "# settings", "name = demo")
NAMES = ("zap", "frob", "blip", "quux", "zorg", "miro", "tund", "vex", "plom", "gax",
         "korr", "bix", "dune", "yelp", "sorb", "nack")
# The tests tasks' function names: every stem of NAMES with a digit 1-3.
TASK_NAMES = tuple(f"{base}{digit}" for base in NAMES for digit in range(1, 4))
INPUTS = (0, 1, 2, 5, 10, -3)
VISIBLE = 2
HELD_OUT_FRACTION = 0.2
VALIDATION_FRACTION = 0.15
PRACTICE = {"file": 240, "search": 240, "tests": 240}


def _fraction(key: str) -> float:
  return int(hashlib.sha256(key.encode()).hexdigest()[:15], 16) / 16**15


def _split(unit: str) -> str:
  f = _fraction(unit)
  return ("held_out" if f < HELD_OUT_FRACTION
          else "validation" if f < HELD_OUT_FRACTION + VALIDATION_FRACTION else "train")


def _task(tid, unit, prompt, name, op, k, files, hint, split=None):
  sign = OPS[op][0]
  solution = f"def {name}(x):\n    return x {sign} {k}\n"
  asserts = [f"assert {name}({x}) == {eval(f'{x} {sign} {k}')}" for x in INPUTS]
  return {"id": tid, "prompt": prompt, "tests": "\n".join(asserts) + "\n",
          "entry_point": "", "reference": solution, "split": split or _split(unit),
          "extra": {"files": files, "solution": "solution.py", "assemble": "completion",
                    "tests_format": "script", "family": hint["variant"],
                    "tests_visible": "\n".join(asserts[:VISIBLE]) + "\n",
                    "hint": hint}}


def file_tasks(rng, constants=range(2, 10), practice=False, symbols=SYMBOLS):
  for op, (_, word) in OPS.items():
    for k in constants:
      for symbol in symbols:
        path = rng.choice(FILES)
        name = f"{op}_{symbol.lower()}"
        lines = [f"{symbol} = {k}"]
        if rng.random() < 0.5:
          lines.insert(0, rng.choice(NOISE))
        prompt = (f"Write solution.py defining {name}(x) that returns x {word} {symbol}. "
                  f"{symbol} is set in {path}.")
        yield _task(f"agent/{'practice/' * practice}file/{op}/k{k}/{symbol}",
                    f"{op}/k{k}/{symbol}",
                    prompt, name, op, k, {path: "\n".join(lines) + "\n"},
                    {"variant": "file", "path": path, "symbol": symbol, "name": name},
                    split="train" if practice else None)


def search_tasks(rng, constants=range(2, 10), practice=False, symbols=SYMBOLS):
  for op, (_, word) in OPS.items():
    for k in constants:
      for symbol in symbols:
        paths = rng.sample(FILES, 3)
        files = {p: f"{rng.choice(NOISE)}\n" for p in paths}
        where = rng.choice(paths)
        files[where] += f"{symbol} = {k}\n"
        name = f"{op}_{symbol.lower()}"
        prompt = (f"Write solution.py defining {name}(x) that returns x {word} {symbol}. "
                  f"{symbol} is set in one of the workspace files.")
        yield _task(f"agent/{'practice/' * practice}search/{op}/k{k}/{symbol}",
                    f"{op}/k{k}/{symbol}",
                    prompt, name, op, k, files,
                    {"variant": "search", "path": where, "symbol": symbol, "name": name},
                    split="train" if practice else None)


def tests_tasks(rng, names=None, practice=False):
  """Tests tasks: every operation with every name of NAMES and digit 1-3, or with each
  (operation, name) pair of `names` when given."""
  pairs = names or [(op, name) for op in OPS for name in TASK_NAMES]
  for op, name in pairs:
    word = OPS[op][1]
    k = rng.randint(2, 9)
    prompt = (f"Make the tests pass: solution.py must define a function of x that "
              f"returns x {word} {k}. Run the tests to learn its name.")
    yield _task(f"agent/{'practice/' * practice}tests/{op}/{name}", f"{op}/{name}",
                prompt, name, op, k, {"solution.py": "# write the solution here\n"},
                {"variant": "tests", "name": name},
                split="train" if practice else None)


def made_up_names(rng, n):
  """n distinct names no split uses: two consonant-vowel syllables (sometimes a closing
  consonant) and a digit 1-9, e.g. "rutek7"."""
  consonants, vowels = "bdfghklmnprstvz", "aeiou"
  taken, out = set(NAMES), []
  while len(out) < n:
    stem = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(2))
    stem += rng.choice(consonants) if rng.random() < 0.5 else ""
    name = f"{stem}{rng.randint(1, 9)}"
    if stem not in taken and name not in out:
      out.append(name)
  return out


def practice_tasks(rng, n_file=PRACTICE["file"], n_search=PRACTICE["search"],
                   n_tests=PRACTICE["tests"]):
  """Training-only tasks on units no split uses: a random sample of the file and search
  tasks on PRACTICE_SYMBOLS with constants 2-99, and tests tasks whose names are made up
  (made_up_names), each with a random operation."""
  picks = ((file_tasks(rng, range(2, 100), True, PRACTICE_SYMBOLS), n_file),
           (search_tasks(rng, range(2, 100), True, PRACTICE_SYMBOLS), n_search))
  for gen, n in picks:
    rows = list(gen)
    yield from rng.sample(rows, n)
  names = made_up_names(rng, n_tests)
  yield from tests_tasks(rng, [(rng.choice(sorted(OPS)), name) for name in names], True)


def add_decoy(row: dict) -> dict:
  """The row with its symbol's old value commented out in the workspace (file and search
  tasks; tests tasks and practice tasks are returned as they are: the practice tasks are
  where a warm start learns to copy, and with decoys in them, and a demonstrator that
  copies either line, seed 0's warm start did not learn to copy in its 600 steps).
  Seeded by the task id alone, so the decoys do not depend on the order of the rows."""
  hint = row["extra"]["hint"]
  if hint["variant"] not in ("file", "search") or "/practice/" in row["id"]:
    return row
  rng = random.Random(f"decoy/{row['id']}")
  k = int(row["reference"].split()[-1])
  old = rng.choice([c for c in range(2, 10) if c != k])
  files = dict(row["extra"]["files"])
  if hint["variant"] == "file":
    where = hint["path"]
  else:
    where = rng.choice(sorted(p for p in files if p != hint["path"]))
  lines = files[where].splitlines()
  lines.insert(rng.randint(0, len(lines)), f"# {hint['symbol']} = {old}")
  files[where] = "\n".join(lines) + "\n"
  extra = {**row["extra"], "files": files, "hint": {**hint, "decoy": old}}
  return {**row, "extra": extra}


def add_note(row: dict) -> dict:
  """The row with a stale note ending its prompt (every task but the practice ones, which
  are returned as they are): for file and search tasks another constant 2-9 for the
  symbol, for tests tasks another name of the pool. Seeded by the task id alone."""
  hint = row["extra"]["hint"]
  if "/practice/" in row["id"]:
    return row
  rng = random.Random(f"note/{row['id']}")
  if hint["variant"] == "tests":
    old = rng.choice([n for n in TASK_NAMES if n != hint["name"]])
    note = f" An old note calls it {old}."
  else:
    k = int(row["reference"].split()[-1])
    old = rng.choice([c for c in range(2, 10) if c != k])
    note = f" An old note says {hint['symbol']} = {old}."
  extra = {**row["extra"], "hint": {**hint, "note": old}}
  return {**row, "prompt": row["prompt"] + note, "extra": extra}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--decoys", action="store_true",
                      help="write agent_tasks_decoy.jsonl: file and search tasks with "
                           "their symbol's old value commented out beside the live one")
  parser.add_argument("--notes", action="store_true",
                      help="write agent_tasks_notes.jsonl: every task but the practice ones "
                           "with a stale note (a wrong constant or name) ending its prompt")
  args = parser.parse_args(argv)
  if args.decoys and args.notes:
    parser.error("--decoys and --notes write different files: give one")
  rng = random.Random(0)
  rows = [t for gen in (file_tasks, search_tasks, tests_tasks) for t in gen(rng)]
  rows += list(practice_tasks(random.Random(2)))
  ids = [r["id"] for r in rows]
  assert len(ids) == len(set(ids))
  random.Random(1).shuffle(rows)
  name = "agent_tasks.jsonl"
  if args.decoys:
    rows, name = [add_decoy(r) for r in rows], "agent_tasks_decoy.jsonl"
  if args.notes:
    rows, name = [add_note(r) for r in rows], "agent_tasks_notes.jsonl"
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
  with open(path, "w") as f:
    for row in rows:
      f.write(json.dumps(row, sort_keys=True) + "\n")
  counts = {}
  for r in rows:
    key = (r["extra"]["hint"]["variant"], r["split"])
    counts[key] = counts.get(key, 0) + 1
  print(f"wrote {len(rows)} tasks to {path}: {dict(sorted(counts.items()))}")


if __name__ == "__main__":
  main()
