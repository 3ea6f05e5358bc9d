"""Writes data/tiny_tasks.jsonl: small Python problems a tiny byte-level policy can learn.

Each problem is a HumanEval-style prompt (a signature and a one-line docstring),
a one-line reference body, and assert tests whose expected values come from
running the reference on fixed inputs. Problems come in families (add a
constant, filter a list, change a string's case, ...); within a family the
constants, names and phrasings vary. The split is fixed in the file: a unit
goes to held_out with probability 0.2 and to validation with probability 0.15
by a hash of its name, in all its phrasings at once (validation is for tuning;
held_out is reported once per config). For families with a constant the unit is (family, constant),
so "add 7" is held out while "add 3" and "multiply by 7" are trained on; for
the fixed functions (square, reverse a list, ...) it is (family, function name),
so a held-out problem there shares its docstrings with a training problem and
differs in the name it must define. No held-out or validation problem appears
in training.

    python data/make_tiny_tasks.py     # rewrites data/tiny_tasks.jsonl deterministically

The file is committed; this script documents how it was made.
"""

from __future__ import annotations

import hashlib
import json
import os
import random

INT_INPUTS = [0, 1, 2, 5, 7, 10, -3, 12, 25, 100]
LIST_INPUTS = [[1, 2, 3], [5, 0, 8, 2], [4], [7, 7, 1, 9, 3], [-2, 6, 3]]
STR_INPUTS = ["hello", "Data", "abcab", "a b c", "zoo", "Python"]
WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven",
         8: "eight", 9: "nine", 10: "ten"}


def unary_int():
  ops = [
      ("add", "x + {k}", ["Return x plus {k}.", "Add {k} to x.", "Return {k} more than x."]),
      ("sub", "x - {k}", ["Return x minus {k}.", "Subtract {k} from x."]),
      ("mul", "x * {k}", ["Return x times {k}.", "Multiply x by {k}."]),
      ("mod", "x % {k}", ["Return the remainder of x divided by {k}.", "Return x modulo {k}."]),
      ("floordiv", "x // {k}", ["Return x divided by {k}, rounded down.",
                                "Return the integer quotient of x and {k}."]),
      ("gt", "x > {k}", ["Return True if x is greater than {k}.", "Check whether x exceeds {k}."]),
      ("lt", "x < {k}", ["Return True if x is less than {k}.", "Check whether x is below {k}."]),
      ("eq", "x == {k}", ["Return True if x equals {k}.", "Check whether x is {k}."]),
      ("multiple", "x % {k} == 0", ["Return True if x is a multiple of {k}.",
                                    "Check whether {k} divides x."]),
  ]
  for name, expr, docs in ops:
    for k in range(2, 11):
      for j, doc in enumerate(docs):
        fname = f"{name}_{WORDS[k]}" if j % 2 else f"{name}_{k}"
        yield (f"{name}/k{k}/d{j}", "int", fname, "x", expr.format(k=k), doc.format(k=k))


def unary_fixed():
  items = [
      ("square", "x * x", ["Return the square of x.", "Return x multiplied by itself."]),
      ("negate", "-x", ["Return the negation of x.", "Return x with its sign flipped."]),
      ("absolute", "abs(x)", ["Return the absolute value of x.", "Return x without its sign."]),
      ("double", "x + x", ["Return twice x.", "Return x doubled."]),
      ("is_even", "x % 2 == 0", ["Return True if x is even.", "Check whether x is even."]),
      ("is_odd", "x % 2 == 1", ["Return True if x is odd.", "Check whether x is odd."]),
      ("is_positive", "x > 0", ["Return True if x is positive.", "Check whether x is above zero."]),
      ("is_zero", "x == 0", ["Return True if x is zero.", "Check whether x equals zero."]),
  ]
  for name, expr, docs in items:
    for j, doc in enumerate(docs):
      for fname in (name, f"get_{name}" if not name.startswith("is_") else f"check_{name[3:]}"):
        yield (f"{name}/{fname}/d{j}", "int", fname, "x", expr, doc)


def list_ops():
  items = [
      ("total", "sum(xs)", ["Return the sum of the list xs.", "Add up the numbers in xs."]),
      ("largest", "max(xs)", ["Return the largest number in xs.", "Return the maximum of xs."]),
      ("smallest", "min(xs)", ["Return the smallest number in xs.", "Return the minimum of xs."]),
      ("count", "len(xs)", ["Return the number of items in xs.", "Return the length of xs."]),
      ("first", "xs[0]", ["Return the first item of xs.", "Return the item at the start of xs."]),
      ("last", "xs[-1]", ["Return the last item of xs.", "Return the item at the end of xs."]),
      ("ordered", "sorted(xs)", ["Return xs sorted in increasing order.",
                                 "Return the items of xs from smallest to largest."]),
      ("backwards", "xs[::-1]", ["Return xs in reverse order.", "Return the items of xs reversed."]),
  ]
  for name, expr, docs in items:
    for j, doc in enumerate(docs):
      for fname in (name, f"list_{name}"):
        yield (f"{name}/{fname}/d{j}", "list", fname, "xs", expr, doc)
  params = [
      ("scale", "[x * {k} for x in xs]", ["Return a list with every item of xs times {k}.",
                                          "Multiply each number in xs by {k}."]),
      ("shift", "[x + {k} for x in xs]", ["Return a list with {k} added to every item of xs.",
                                          "Add {k} to each number in xs."]),
      ("above", "[x for x in xs if x > {k}]", ["Return the items of xs greater than {k}.",
                                               "Keep only the numbers in xs above {k}."]),
      ("count_of", "xs.count({k})", ["Return how many times {k} appears in xs.",
                                     "Count the occurrences of {k} in xs."]),
  ]
  for name, expr, docs in params:
    for k in range(1, 10):
      for j, doc in enumerate(docs):
        yield (f"{name}/k{k}/d{j}", "list", f"{name}_{k}", "xs", expr.format(k=k), doc.format(k=k))


def string_ops():
  items = [
      ("shout", "s.upper()", ["Return s in upper case.", "Convert s to capital letters."]),
      ("whisper", "s.lower()", ["Return s in lower case.", "Convert s to small letters."]),
      ("mirror", "s[::-1]", ["Return s reversed.", "Return the characters of s in reverse order."]),
      ("size", "len(s)", ["Return the length of s.", "Return the number of characters in s."]),
      ("initial", "s[0]", ["Return the first character of s.", "Return the letter s starts with."]),
      ("title_case", "s.title()", ["Return s in title case.", "Capitalise each word of s."]),
  ]
  for name, expr, docs in items:
    for j, doc in enumerate(docs):
      for fname in (name, f"str_{name}"):
        yield (f"{name}/{fname}/d{j}", "str", fname, "s", expr, doc)
  for c in "abcdeopstz":
    for j, doc in enumerate(["Return how many times '{c}' appears in s.",
                             "Count the letter '{c}' in s."]):
      yield (f"count_char/{c}/d{j}", "str", f"count_{c}", "s", f"s.count('{c}')", doc.format(c=c))
    for j, doc in enumerate(["Return s with '{c}' added at the end.", "Append '{c}' to s."]):
      yield (f"append_char/{c}/d{j}", "str", f"append_{c}", "s", f"s + '{c}'", doc.format(c=c))
    for j, doc in enumerate(["Return True if s starts with '{c}'.",
                             "Check whether s begins with '{c}'."]):
      yield (f"starts/{c}/d{j}", "str", f"starts_{c}", "s", f"s.startswith('{c}')",
             doc.format(c=c))


def binary_ops():
  items = [
      ("plus", "a + b", ["Return the sum of a and b.", "Add a and b."]),
      ("minus", "a - b", ["Return a minus b.", "Subtract b from a."]),
      ("times", "a * b", ["Return the product of a and b.", "Multiply a by b."]),
      ("bigger", "max(a, b)", ["Return the larger of a and b.", "Return the maximum of a and b."]),
      ("smaller", "min(a, b)", ["Return the smaller of a and b.",
                                "Return the minimum of a and b."]),
      ("same", "a == b", ["Return True if a equals b.", "Check whether a and b are equal."]),
  ]
  for name, expr, docs in items:
    for j, doc in enumerate(docs):
      for fname in (name, f"{name}_two", f"do_{name}"):
        yield (f"{name}/{fname}/d{j}", "pair", fname, "a, b", expr, doc)


INPUTS = {"int": [(x,) for x in INT_INPUTS], "list": [(x,) for x in LIST_INPUTS],
          "str": [(x,) for x in STR_INPUTS],
          "pair": [(3, 4), (10, -2), (0, 0), (7, 7), (-5, 2), (12, 30)]}


def make_task(key, kind, fname, args, expr, doc):
  prompt = f'def {fname}({args}):\n    """{doc}"""\n'
  body = f"    return {expr}\n"
  namespace: dict = {}
  exec(prompt + body, namespace)
  fn = namespace[fname]
  asserts = []
  for inputs in INPUTS[kind]:
    try:
      want = fn(*[list(i) if isinstance(i, list) else i for i in inputs])
    except (IndexError, ValueError, ZeroDivisionError):
      continue  # e.g. the first item of an empty list: not part of the problem
    call = ", ".join(repr(i) for i in inputs)
    asserts.append(f"    assert candidate({call}) == {want!r}")
  tests = "def check(candidate):\n" + "\n".join(asserts) + "\n"
  unit = key.rsplit("/d", 1)[0]
  fraction = _hash_fraction(unit)
  split = ("held_out" if fraction < HELD_OUT_FRACTION
           else "validation" if fraction < HELD_OUT_FRACTION + VALIDATION_FRACTION else "train")
  return {"id": f"tiny/{key}/{fname}", "prompt": prompt, "reference": body, "tests": tests,
          "entry_point": fname, "split": split}


HELD_OUT_FRACTION = 0.2
VALIDATION_FRACTION = 0.15


def _hash_fraction(key: str) -> float:
  return int(hashlib.sha256(key.encode()).hexdigest()[:15], 16) / 16**15


def main():
  tasks = {}
  for gen in (unary_int, unary_fixed, list_ops, string_ops, binary_ops):
    for item in gen():
      task = make_task(*item)
      tasks[task["id"]] = task
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_tasks.jsonl")
  rows = sorted(tasks.values(), key=lambda t: t["id"])
  random.Random(0).shuffle(rows)
  with open(path, "w") as f:
    for row in rows:
      f.write(json.dumps(row, sort_keys=True) + "\n")
  print(f"wrote {len(rows)} tasks to {path}")


if __name__ == "__main__":
  main()
