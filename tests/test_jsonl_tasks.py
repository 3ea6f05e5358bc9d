"""JSON-lines task sets: validation, deterministic splits, the tfds builder, references."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rlcode.evaluation import scoring
from rlcode.data.extras import CodeExtra
from rlcode.data.jsonl import JsonlTasks, read_jsonl_tasks
from rlcode.data.tasks import load_tasks
from rlcode.errors import BadInput, UnknownKey

FIXTURE = Path(__file__).parent / "data" / "tiny_tasks.jsonl"
DEFAULT_JOB_TASKS = Path(__file__).parent.parent / "data" / "tiny_tasks.jsonl"


def _expected_held_out(fraction):
  held = set()
  for line in FIXTURE.read_text().splitlines():
    row = json.loads(line)
    key = row.get("family") or row["id"]
    bucket = int(hashlib.sha256(key.encode()).hexdigest()[:15], 16) / 16**15
    if row.get("split") == "held_out" or ("split" not in row and bucket < fraction):
      held.add(row["id"])
  return held


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.2, 1.0])
def test_split_by_hash_of_family_or_id(fraction):
  splits = read_jsonl_tasks(FIXTURE, fraction)
  held = {t.id for t in splits["held_out"]}
  assert held == _expected_held_out(fraction)
  assert {t.id for t in splits["train"]} | held == {
      json.loads(l)["id"] for l in FIXTURE.read_text().splitlines()}
  assert not {t.id for t in splits["train"]} & held
  assert "tiny/maximum" in held  # explicit split field
  families = {t.id: ("held_out" if t.id in held else "train")
              for t in splits["train"] + splits["held_out"]}
  assert families["tiny/fizz_3"] == families["tiny/fizz_5"]


def test_fields_become_tasks():
  tasks = {t.id: t for s in read_jsonl_tasks(FIXTURE, 0.2).values() for t in s}
  assert tasks["tiny/is_even"].tests == (
      "assert is_even(2)\nassert not is_even(3)\nassert is_even(0)\nassert not is_even(-7)")
  assert tasks["tiny/fizz_3"].extra == CodeExtra(family="fizz")
  assert tasks["tiny/reverse"].extra == CodeExtra(assemble="completion")
  assert all(t.kind == "code" for t in tasks.values())


@pytest.mark.parametrize("line,message", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"id": "x", "prompt": "", "tests": "assert 1", "entry_point": ""}', "missing fields"),
    ('{"id": "x", "prompt": "", "tests": "assert 1", "entry_point": "", "reference": "", '
     '"tset": 1}', "unknown fields"),
    ('{"id": "x", "prompt": 3, "tests": "assert 1", "entry_point": "", "reference": ""}',
     "'prompt' must be a string"),
    ('{"id": "tiny/add", "prompt": "", "tests": "assert 1", "entry_point": "", "reference": ""}',
     "repeated"),
    ('{"id": "x", "prompt": "", "tests": [], "entry_point": "", "reference": ""}', "tests must"),
    ('{"id": "x", "prompt": "", "tests": "assert 1", "entry_point": "", "reference": "", '
     '"split": "dev"}', "split must"),
])
def test_bad_lines_fail_with_line_number(tmp_path, line, message):
  path = tmp_path / "bad.jsonl"
  path.write_text(FIXTURE.read_text().splitlines()[0] + "\n\n" + line + "\n")
  with pytest.raises(ValueError, match=f"bad.jsonl:3: .*{message}"):
    read_jsonl_tasks(path, 0.2)


def test_builder_configs_do_not_collide(tmp_path):
  a = JsonlTasks(data_dir=str(tmp_path), path=FIXTURE, held_out_fraction=0.2)
  b = JsonlTasks(data_dir=str(tmp_path), path=FIXTURE, held_out_fraction=0.5)
  assert a.builder_config.name != b.builder_config.name
  for builder, fraction in ((a, 0.2), (b, 0.5)):
    expected = read_jsonl_tasks(FIXTURE, fraction)
    for split in ("train", "held_out"):
      assert load_tasks(builder, split) == sorted(expected[split], key=lambda t: t.id)


def test_a_split_too_large_for_memory_is_a_clear_error(tmp_path, monkeypatch):
  # tfds spills a split over its in-memory limit (1 GB) to disk through TensorFlow,
  # which is not installed: lowered here so that the fixture crosses it.
  import importlib.util
  if importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("TensorFlow is installed: tfds spills to disk instead of failing, nothing to check")
  from tensorflow_datasets.core import shuffle
  monkeypatch.setattr(shuffle, "MAX_MEM_BUFFER_SIZE", 100)
  builder = JsonlTasks(data_dir=str(tmp_path), path=FIXTURE, held_out_fraction=0.2)
  with pytest.raises(BadInput, match="over 1 GB, which tfds can only write through TensorFlow"):
    load_tasks(builder, "train")


def test_a_split_without_rows_is_a_clear_error(tmp_path):
  path = tmp_path / "only_train.jsonl"
  rows = [json.loads(l) for l in FIXTURE.read_text().splitlines()[:3]]
  path.write_text("".join(json.dumps({**r, "split": "train"}) + "\n" for r in rows))
  builder = JsonlTasks(data_dir=str(tmp_path / "tfds"), path=path)
  assert [t.id for t in load_tasks(builder, "train")] == sorted(r["id"] for r in rows)
  with pytest.raises(UnknownKey, match="no split 'held_out'; splits are \\['train'\\]"):
    load_tasks(builder, "held_out")


def test_references_pass_in_the_sandbox(tmp_path):
  tasks = [t for s in read_jsonl_tasks(FIXTURE, 0.2).values() for t in s]
  path = tmp_path / "refs.jsonl"
  path.write_text("".join(json.dumps({"task_id": t.id, "completion": t.reference}) + "\n"
                          for t in tasks))
  report = scoring.evaluate_completions_file(tasks, path, out_dir=tmp_path, workers=2)
  assert report["pass_at_k"] == {"pass@1": 1.0}, report


def test_reference_share_makes_tests_only_training_tasks(tmp_path):
  import dataclasses as dc
  import ml_collections

  from rlcode.data import sources
  from rlcode.policy import warm_start

  def data(share):
    return ml_collections.ConfigDict(dict(
        source="jsonl", path=str(DEFAULT_JOB_TASKS), data_dir=str(tmp_path),
        train_split="train", eval_split="held_out", max_eval_tasks=None, reference_share=share, repo=None,
        mining=None, swe=None))

  full = sources.load(data(1.0), "train")
  assert all(t.reference for t in full)
  kept = {}
  for share in (0.3, 0.6):
    tasks = sources.load(data(share), "train")
    assert [t.id for t in tasks] == [t.id for t in full]  # every task still trains (its tests)
    assert all(t.tests == f.tests for t, f in zip(tasks, full))
    kept[share] = {t.id for t in tasks if t.reference}
    # The hash decides, the same in every call; the references left are the real ones.
    assert kept[share] == {t.id for t in full if sources.keeps_reference(t.id, share)}
    assert all(t.reference == f.reference for t, f in zip(tasks, full) if t.reference)
    assert 0 < len(kept[share]) < len(full)
  assert kept[0.3] <= kept[0.6]  # a larger share keeps a superset
  # Held-out splits keep theirs (nothing trains on them).
  assert all(t.reference for t in sources.load(data(0.3), "held_out"))
  # The warm start trains on the references alone; a task without tests keeps its reference.
  job = warm_start.Job(ws=ml_collections.ConfigDict(dict(train_repeats=2, data=None)), seed=0,
                       model=None, data=ml_collections.ConfigDict(dict(reference_share=0.3)),
                       length_multiple=1, max_new_tokens=64)
  tasks = sources.load(data(0.3), "train")
  no_tests = dc.replace(tasks[0], reference="", tests="")
  own, _ = warm_start.warm_start_tasks(job, None, 64, tasks + [no_tests])
  assert sorted(t.id for t in own) == sorted(2 * [*kept[0.3], no_tests.id])
  with pytest.raises(BadInput, match="no reference solution"):
    warm_start.warm_start_tasks(job, None, 64, [t for t in tasks if not t.reference])


def test_the_warm_start_key_ignores_unset_keys():
  """A key the schema gains later, left unset, keeps a cached warm start's hash; set, or any
  other change of what the warm start depends on, changes it."""
  import ml_collections

  from rlcode.config import loader
  from rlcode.policy import warm_start
  config = loader.load_config(str(Path(__file__).parent.parent / "configs" / "grpo_tiny.py"))
  job = lambda data, seed=0: warm_start.Job.of(config.warmstart, seed=seed, model=config.model,
                                               data=data, rl=config.rl)
  key = warm_start.warm_start_key(job(config.data))
  grown = ml_collections.ConfigDict({**config.data.to_dict(), "new_section": None})
  assert warm_start.warm_start_key(job(grown)) == key
  grown.new_section = {"size": 3}
  assert warm_start.warm_start_key(job(grown)) != key
  assert warm_start.warm_start_key(job(config.data, seed=1)) != key
