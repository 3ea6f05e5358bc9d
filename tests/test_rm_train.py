"""`rlcode train` of a reward model (configs/rm_choices.py) end to end on a learnable choices file: it learns, resumes to the same
numbers, its checkpoint scores through the scorer and the "rm" reward; its user errors are
one line on stderr."""

import json
import os
import shutil

import numpy as np
import pytest

from rlcode import cli, rewards
from rlcode.config import loader
from rlcode.evaluation import selection_eval
from rlcode.data.choices import Choice, write_choices
from rlcode.data.tasks import Task
from rlcode.runs.metrics import read_metrics
from rlcode.rm import scorer as scorer_lib
from rlcode.train.rm_loop import train as train_rm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "rm_choices.py")
BODIES = ["    return x + 1\n", "    return x - 1\n", "    return x * 2\n", "    return 0\n",
          "    return x\n"]
SMALL = ["--config.model.arch.hidden_size=32", "--config.model.arch.intermediate_size=64",
         "--config.model.arch.num_layers=1", "--config.model.arch.num_heads=2",
         "--config.model.arch.num_kv_heads=1", "--config.model.arch.head_dim=16",
         "--config.model.arch.max_seq_len=64", "--config.rm.head_hidden=16",
         "--config.rm.batch_choices=8", "--config.rm.init_from=None",
         "--config.train.progress_bar=false"]


def _choices_file(tmp_path, n=120):
  """Users always pick the candidate that adds one; k varies from 2 to 4."""
  rng = np.random.default_rng(0)
  rows = []
  for i in range(n):
    k = 2 + i % 3
    bodies = [BODIES[0]] + list(rng.choice(BODIES[1:], k - 1, replace=False))
    order = rng.permutation(k)
    cands = [bodies[j] for j in order]
    passed = [float(c == BODIES[0]) for c in cands]
    rows.append((Choice(f"c{i:03d}", f"def f{i % 7}(x):\n", tuple(cands), cands.index(BODIES[0]),
                        {"features": {"passed": passed}}),
                 "validation" if i % 5 == 0 else "train"))
  path = tmp_path / "choices.jsonl"
  write_choices(path, rows)
  return str(path)


def _config(tmp_path, workdir, *extra):
  return loader.load_config(CONFIG, [
      *SMALL, f"--config.data.path={_choices_file(tmp_path)}",
      f"--config.data.data_dir={tmp_path / 'tfds'}", f"--config.workdir={workdir}", *extra])


@pytest.mark.slow
def test_learns_and_scores_through_the_reward(tmp_path):
  workdir = str(tmp_path / "rm")
  config = _config(tmp_path, workdir, "--config.rm.pooling=mean", "--config.train.steps=40",
                   "--config.train.eval_every=40", "--config.optimizer.learning_rate=3e-3",
                   "--config.optimizer.decay_steps=40")
  rows = train_rm(config)
  evals = [r for r in rows if "eval/accuracy" in r]
  assert [r["step"] for r in evals] == [0, 40]
  assert evals[0]["eval/choices"] == 24
  # Chance is about 1/3 (k = 2..4), but a random ranking of the five bodies can already
  # agree with the users' rule: the loss says what was learnt.
  assert evals[-1]["eval/accuracy"] >= 0.9
  assert evals[-1]["eval/loss"] < 0.3 * evals[0]["eval/loss"]
  # The saved model scores the chosen candidate highest, through the "rm" reward too.
  scorer = scorer_lib.load(workdir)  # the instance the reward below uses
  assert scorer.step == 40 and scorer.features == ()
  task = Task(id="t", prompt="def f3(x):\n", tests="assert True\n")
  scores = scorer.score([task.prompt] * 5, BODIES)
  assert int(np.argmax(scores)) == 0
  out = rewards.compute({"rm": 1.0}, [task] * 5, BODIES, {"rm": {"checkpoint": workdir}})
  np.testing.assert_allclose(out.scores, scores, rtol=1e-5)
  # As a selector: the reward model's pick among five samples is the passing one.
  coded = Task(id="t", prompt="def f3(x):\n", entry_point="f3",
               tests="def check(candidate):\n    assert candidate(3) == 4\n")
  table = selection_eval.evaluate_selection([coded], [("t", b) for b in BODIES],
                                            selectors=["rm"], ks=[1, 5],
                                            rm_scores=scorer_lib.selection_scorer(workdir))
  assert table["first"][5] == pytest.approx(0.2) and table["rm"][5] == 1.0
  assert table["gap_closed"]["rm"][5] == 1.0
  # The reward reads the answer up to the tests reward's stop sequences, so do the tokens.
  ends = rewards.answer_ends({"rm": 1.0}, [task], [BODIES[0] + "\ndef g(): pass\n"])
  assert ends.tolist() == [len(BODIES[0])]


@pytest.mark.slow
def test_resume_gives_the_same_numbers_with_features(tmp_path):
  # A run killed after its step-2 checkpoint (the later checkpoint removed) resumes to the
  # numbers of the uninterrupted run; the model takes the "passed" feature as an input.
  straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
  config = lambda workdir: _config(tmp_path, workdir, "--config.rm.features=('passed',)",
                                   "--config.train.eval_every=0", "--config.train.steps=4",
                                   "--config.train.checkpoint_every=2",
                                   "--config.train.keep_checkpoints=2")
  train_rm(config(straight))
  shutil.copytree(straight, resumed)
  shutil.rmtree(os.path.join(resumed, "checkpoints", "4"))
  rows = train_rm(config(resumed))
  assert [r["step"] for r in rows] == [3, 4]
  key = lambda rows: [(r["step"], r["loss"], r["accuracy"]) for r in rows]
  assert key(read_metrics(resumed)) == key(read_metrics(straight))


def _one_line_error(capsys, argv, *needles):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err, err
  for needle in needles:
    assert needle in err, (needle, err)


@pytest.mark.slow
def test_cli_train_rm_and_its_errors(tmp_path, capsys):
  path = _choices_file(tmp_path, n=20)
  workdir = str(tmp_path / "cli")
  base = ["train", "--config", CONFIG, *SMALL, f"--config.data.path={path}",
          f"--config.data.data_dir={tmp_path / 'tfds'}", f"--config.workdir={workdir}"]
  assert cli.main([*base, "--config.train.steps=2", "--config.train.eval_every=0"]) == 0
  assert [r["step"] for r in read_metrics(workdir)] == [1, 2]
  _one_line_error(capsys, [*base, "--config.data.path=nowhere.jsonl"], "nowhere.jsonl",
                  "no such choices file")
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"prompt": "p", "candidates": ["a", "b"], "chosen": 5}) + "\n")
  _one_line_error(capsys, [*base, f"--config.data.path={bad}"], f"{bad}:1",
                  "chosen=5 is out of range")
  _one_line_error(capsys, [*base, "--config.rm.features=('tests',)",
                           f"--config.workdir={tmp_path / 'f'}"], "rm.features=('tests',)", "tests_fraction")
  _one_line_error(capsys, [*base, "--config.rm.batch_choices=7", "--config.mesh.data=2"],
                  "batch_choices=7")
  _one_line_error(capsys, [*base, "--config.rm.init_from=" + str(tmp_path / "none"),
                           f"--config.workdir={tmp_path / 'g'}"], "config.rm.init_from")
