"""The held-out split read through one door (experiments.lib.heldout): each read recorded
in the manifest of the result it feeds, and a read of a design that result's earlier reads
did not have flagged there and in the printed output; the time split of executable PR
tasks that gives configs/agent_swe.py its validation split."""

from __future__ import annotations

import json
import os
import types

import pytest

from experiments.lib import heldout, results
from rlcode.config import loader
from rlcode.data import sources
from rlcode.swe.config import SweConfig
from rlcode.swe.mining import split_by_time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRPO = os.path.join(ROOT, "configs", "grpo_tiny.py")


@pytest.fixture(autouse=True)
def reads(monkeypatch):
  """This process's reads start empty in each test (and are a later process's after
  `fresh`)."""
  monkeypatch.setattr(results, "HELD_OUT_READS", [])
  return monkeypatch


def fresh(monkeypatch):
  """What a later process starts with: no reads of its own."""
  monkeypatch.setattr(results, "HELD_OUT_READS", [])


def manifest(where: str) -> dict:
  with open(os.path.join(where, results.MANIFEST)) as f:
    return json.load(f)


def test_a_read_returns_the_split_and_is_recorded(tmp_path):
  config = loader.load_config(GRPO, [f"--config.data.data_dir={tmp_path / 'tfds'}"])
  tasks = heldout.read(config, "held_out")
  assert [t.id for t in tasks] == [t.id for t in sources.load(config.data, "held_out")]
  train = {t.id for t in sources.load(config.data, "train")}
  assert tasks and not train & {t.id for t in tasks}
  (entry,) = results.HELD_OUT_READS
  assert (entry["split"], entry["tasks"]) == ("held_out", len(tasks))
  assert entry["design"] == heldout.design_hash(config)
  assert entry["commit"] == results.git_state()["commit"] and entry["command"]
  assert entry["code"] == heldout.code_tree() and entry["date"]
  # A tuning split is not a held-out read: refused, nothing recorded.
  with pytest.raises(ValueError, match="'validation' is not a held-out split"):
    heldout.read(config, "validation")
  assert [t.id for t in heldout.tasks(config, "validation")] == [
      t.id for t in sources.load(config.data, "validation")]
  assert len(results.HELD_OUT_READS) == 1


def test_a_training_process_read_is_recorded_with_its_flag():
  config = loader.load_config(GRPO)
  assert heldout.through_loop(config, "test") == "--config.data.test_split=test"
  (entry,) = results.HELD_OUT_READS
  assert (entry["split"], entry["tasks"]) == ("test", None)
  with pytest.raises(ValueError, match="'train' is not a held-out split"):
    heldout.through_loop(config, "train")


def test_the_design_hash_ignores_seeds_and_places_only():
  base = heldout.design_hash(loader.load_config(GRPO))
  same = ["--config.seed=7", "--config.workdir=/elsewhere", "--config.data.test_split=held_out",
          "--config.train.progress_bar=false", "--config.warmstart.cache_dir=/cache"]
  assert heldout.design_hash(loader.load_config(GRPO, same)) == base
  for changed in ("--config.optimizer.learning_rate=1e-3", "--config.rl.group_size=4",
                  "--config.warmstart.steps=7"):
    assert heldout.design_hash(loader.load_config(GRPO, [changed])) != base, changed


def test_a_read_of_a_changed_design_is_flagged_in_the_manifest_and_printed(
    tmp_path, reads, capsys):
  into = str(tmp_path / "result")
  first = loader.load_config(GRPO)
  heldout.record(first, "held_out", 10)
  results.write("t", "n", {"x": 1}, config=first, into=into)
  m = manifest(into)
  assert len(m["held_out_reads"]) == 1 and "held_out_after_change" not in m
  # A later process, the same design at another seed: no change, nothing printed.
  fresh(reads)
  heldout.record(loader.load_config(GRPO, ["--config.seed=3"]), "held_out", 10)
  results.write("t", "n", {"x": 2}, config=first, into=into)
  m = manifest(into)
  assert len(m["held_out_reads"]) == 2 and "held_out_after_change" not in m
  assert capsys.readouterr().out == ""
  earlier = m["held_out_reads"]
  # Another later process after the learning rate changed: one line, kept in the manifest.
  fresh(reads)
  changed = loader.load_config(GRPO, ["--config.optimizer.learning_rate=1e-3"])
  entry = heldout.record(changed, "held_out", 10)
  results.write("t", "n", {"x": 3}, config=changed, into=into)
  out = capsys.readouterr().out
  assert out.count("\n") == 1 and out.startswith("held-out read after a change: "), out
  assert entry["design"] in out and heldout.design_hash(first) in out and "2 earlier" in out
  m = manifest(into)
  assert m["held_out_reads"] == [*earlier, entry]
  assert len(m["held_out_reads"]) == 3 and m["held_out_after_change"] == [out.strip()]
  # A write with no read keeps the reads and the flag; the same process writing twice
  # flags once.
  results.write("t", "n", {"x": 4}, config=changed, into=into)
  fresh(reads)
  results.write("t", "n", {"x": 5}, config=changed, into=into)
  assert capsys.readouterr().out == ""
  assert manifest(into)["held_out_after_change"] == [out.strip()]
  assert len(manifest(into)["held_out_reads"]) == 3


def test_a_read_goes_to_the_result_written_after_it_not_to_later_ones(tmp_path, reads, capsys):
  """One process writing two results of two designs: each manifest holds its own read, and
  the second result, whose earlier reads are all of its design, is not flagged."""
  first = loader.load_config(GRPO)
  other = loader.load_config(GRPO, ["--config.optimizer.learning_rate=1e-3"])
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  heldout.record(other, "held_out", 10)
  results.write("t", "b", {"x": 0}, config=other, into=b)
  fresh(reads)
  read_a = heldout.record(first, "held_out", 10)
  results.write("t", "a", {"x": 1}, config=first, into=a)
  read_b = heldout.record(other, "held_out", 10)
  results.write("t", "b", {"x": 2}, config=other, into=b)
  assert capsys.readouterr().out == ""
  assert manifest(a)["held_out_reads"] == [read_a]
  m = manifest(b)
  assert m["held_out_reads"][1:] == [read_b] and "held_out_after_change" not in m
  assert {r["design"] for r in m["held_out_reads"]} == {heldout.design_hash(other)}
  assert results.HELD_OUT_READS == []
  # A write that fails before its manifest leaves the read to the next write.
  read_c = heldout.record(first, "held_out", 10)
  with pytest.raises(TypeError):
    results.write("t", "a", {"x": object()}, config=first, into=a)
  assert results.HELD_OUT_READS == [read_c]
  results.write("t", "a", {"x": 3}, config=first, into=a)
  assert manifest(a)["held_out_reads"] == [read_a, read_c] and results.HELD_OUT_READS == []


def test_a_result_without_reads_has_no_held_out_keys(tmp_path):
  where = results.write("t", "n", {"x": 1}, into=str(tmp_path / "r"))
  assert not {"held_out_reads", "held_out_after_change"} & set(manifest(where))


def _tasks(times):
  return [types.SimpleNamespace(id=f"t{i:02d}", extra=types.SimpleNamespace(time=t))
          for i, t in enumerate(times)]


def test_the_validation_split_is_the_latest_before_test():
  found = _tasks(range(20))
  split = split_by_time(found, 0.1, 0.1)
  assert [[t.extra.time for t in split[k]] for k in ("train", "validation", "test")] == [
      list(range(16)), [16, 17], [18, 19]]
  # Positive control: no validation fraction is the split as it was, two names.
  assert {k: [t.id for t in v] for k, v in split_by_time(found, 0.1).items()} == {
      "train": [t.id for t in found[:18]], "test": ["t18", "t19"]}
  # Ties at the test cutoff go to test; at the validation cutoff, to validation.
  split = split_by_time(_tasks([0, 1, 2, 3, 3, 4, 5, 5, 5, 6]), 0.1, 0.3)
  assert [[t.extra.time for t in split[k]] for k in ("train", "validation", "test")] == [
      [0, 1, 2, 3, 3, 4], [5, 5, 5], [6]]


@pytest.mark.parametrize("fraction", [-0.1, 0.9, 1.0])
def test_a_validation_fraction_leaving_no_training_task_is_refused(fraction):
  with pytest.raises(ValueError, match=r"SweConfig.validation_fraction=.* is not in \[0, 1 - "):
    SweConfig(source="repo", validation_fraction=fraction)
