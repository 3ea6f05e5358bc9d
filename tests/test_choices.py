"""Choices files: every malformed row is an error naming file:line; the tfds builder's round
trip and splits; the simulated users' Plackett-Luce choices; ground-truth features."""

import json

import numpy as np
import pytest

from rlcode.data import choices as choices_lib
from rlcode.data.tasks import Task
from rlcode.errors import BadInput
from rlcode.rm import features as features_lib
from rlcode.rm import simulate

GOOD = {"prompt": "def f(x):\n", "candidates": ["    return x\n", "    return 1\n"], "chosen": 1}


def _write(tmp_path, rows):
  path = tmp_path / "choices.jsonl"
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return path


@pytest.mark.parametrize("bad,message", [
    ({**GOOD, "chosen": 2}, r"chosen=2 is out of range for 2 candidates"),
    ({**GOOD, "chosen": -1}, r"chosen=-1 is out of range"),
    ({**GOOD, "candidates": ["only one"], "chosen": 0}, r"k >= 2 candidates, got 1"),
    ({"candidates": GOOD["candidates"], "chosen": 0}, r"missing fields \['prompt'\]"),
    ({**GOOD, "chosen": True}, r"'chosen' must be an integer, got bool"),
    ({**GOOD, "chosen": 1.0}, r"'chosen' must be an integer, got float"),
    ({**GOOD, "candidates": "    return x\n"}, r"'candidates' must be a list of strings"),
    ({**GOOD, "candidates": ["a", 3]}, r"'candidates' must be a list of strings"),
    ({**GOOD, "prompt": None}, r"'prompt' must be a string"),
    ({**GOOD, "choosen": 1}, r"unknown fields \['choosen'\]"),
    ({**GOOD, "extra": []}, r"'extra' must be an object"),
    ({**GOOD, "extra": {"features": {"passed": [1]}}}, r"features\['passed'\] must be a list of 2"),
    ({**GOOD, "extra": {"features": {"passed": [1, float("nan")]}}}, r"2 finite numbers"),
    ({**GOOD, "split": "test"}, r"split must be one of"),
    ({**GOOD, "id": ""}, r"'id' must be a non-empty string"),
    ({**GOOD, "id": "a"}, r"id 'a' is repeated"),
    ("{not json", r"not valid JSON"),
    ("[1, 2]", r"expected a JSON object"),
])
def test_bad_rows_name_file_and_line(tmp_path, bad, message):
  path = _write(tmp_path, [{**GOOD, "id": "a"}, "", bad])
  with pytest.raises(BadInput, match=message) as info:
    choices_lib.read_choices(path)
  assert str(info.value).startswith(f"{path}:3: ")


def test_empty_file(tmp_path):
  with pytest.raises(BadInput, match="no choices"):
    choices_lib.read_choices(_write(tmp_path, [""]))


def test_builder_round_trip_and_splits(tmp_path):
  rows = [{**GOOD, "id": f"c{i}", "prompt": f"def f{i}(x):\n", "chosen": i % 2,
           "extra": {"features": {"passed": [i % 2, 1 - i % 2]}, "note": "x"}}
          for i in range(30)]
  rows[0]["split"] = "validation"
  rows[1] = {**GOOD, "candidates": ["a", "b", "c"], "chosen": 2, "split": "held_out"}
  path = _write(tmp_path, rows)
  read = choices_lib.read_choices(path)
  builder = choices_lib.ChoicesBuilder(data_dir=str(tmp_path / "tfds"), path=path)
  builder.download_and_prepare()
  assert set(builder.info.splits) == set(read) == {"train", "validation", "held_out"}
  for split, expect in read.items():
    got = choices_lib.load_choices(builder, split)
    assert got == sorted(expect, key=lambda c: c.id)
  held = {c.id for c in read["held_out"]}
  assert "line-2" in held  # the default id names the line
  # Splits without a field follow the hash of the prompt, as jsonl.held_out says.
  for r in rows[2:]:
    assert (r["id"] in held) == choices_lib.held_out(r["prompt"], 0.2)
  c0 = read["validation"][0]
  np.testing.assert_array_equal(c0.features(["passed"]), [[0.0], [1.0]])
  with pytest.raises(KeyError, match="no feature"):
    c0.features(["similarity"])


def test_plackett_luce_choices_follow_the_softmax():
  rng = np.random.default_rng(0)
  u, temp = [1.0, 0.0, 2.0, -1.0], 0.7
  draws = np.bincount([simulate.plackett_luce_choice(u, temp, rng) for _ in range(20000)],
                      minlength=4) / 20000
  expect = np.exp(np.array(u) / temp) / np.exp(np.array(u) / temp).sum()
  np.testing.assert_allclose(simulate.choice_probabilities(u, temp), expect)
  # Each share within four binomial standard errors of its probability.
  assert np.all(np.abs(draws - expect) < 4 * np.sqrt(expect * (1 - expect) / 20000))
  assert simulate.plackett_luce_choice([0.0, 3.0, 3.0], 0.0, rng) == 1
  with pytest.raises(ValueError, match="unknown feature"):
    simulate.Utility({"style": 1.0})


TASK = Task(id="t/add1", prompt="def add1(x):\n", reference="    return x + 1\n",
            tests="def check(candidate):\n    assert candidate(0) == 1\n"
                  "    assert candidate(1) == 2\n    assert candidate(2) == 3\n",
            entry_point="add1")


def test_features_and_simulated_choices():
  completions = ["    return x + 1\n", "    return 1 if x == 0 else 2\n", "    return (\n",
                 "    return x + 1\n# trailing text the tests reward cuts\nprint(1)\n"]
  names = list(features_lib.FEATURES)
  f = features_lib.compute([TASK] * 4, completions, names, workers=2)
  col = {n: f[:, j] for j, n in enumerate(names)}
  np.testing.assert_allclose(col["tests_fraction"], [1.0, 2 / 3, 0.0, 1.0], rtol=1e-6)
  np.testing.assert_array_equal(col["passed"], [1, 0, 0, 1])
  # The last answer is cut at the first stop sequence ("\n#"), newline included.
  shown = "    return x + 1"
  assert features_lib.shown_code(TASK, completions[3]) == shown
  assert col["similarity"][0] == 1.0 > col["similarity"][3] > col["similarity"][1]
  np.testing.assert_allclose(col["similarity"][3], 2 * len(shown) / (2 * len(shown) + 1))
  np.testing.assert_allclose(col["length"], [len(completions[0]) / 100,
                                             len(completions[1]) / 100,
                                             len(completions[2]) / 100,
                                             len(shown) / 100], rtol=1e-6)
  table = {n: np.concatenate([col[n], col[n]]) for n in names}
  rng = np.random.default_rng(0)
  rows = simulate.choices_from_samples(
      [TASK], [completions * 2], k=4, utility=simulate.Utility(temperature=0.0), rng=rng,
      split="train", table=table)
  assert [c.id for c, _ in rows] == ["t/add1/0", "t/add1/1"]
  choice, split = rows[0]
  assert split == "train" and choice.k == 4
  # The candidates are the answers as shown: cut where the tests reward cuts.
  assert choice.candidates[3] == shown
  u = [4 * t + 2 * s - l for t, s, l in zip(col["tests_fraction"], col["similarity"],
                                            col["length"])]
  np.testing.assert_allclose(choice.extra["utility"], u, atol=1e-5)
  assert choice.chosen == 0  # temperature 0: the best, the first of two equal ones
