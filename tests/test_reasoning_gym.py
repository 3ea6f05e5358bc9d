"""reasoning-gym as a task source (rlcode.data.reasoning_gym, config.data.gym) and its
verifiers as the "gym" reward (rlcode.rewards.gym).

The builder: splits that share no question (checked by text, on a generator small enough
that its random draws repeat questions), the same tasks from two builds in two data
directories, tasks that round-trip through tfds with their metadata's tuples and int keys
intact (arc_agi's score_answer compares tuples). The reward: 1 for the entry's own answer
in each form the extraction rule reads, 0 for a wrong one, no exception on garbage, huge
or surrogate-laden text. Bad input: unknown, refused or misconfigured generators and bad
sizes are one line through the loader and through `rlcode` (exit 2). The smoke job of
configs/grpo_gym.py trains 2 GRPO steps at a toy model size (slow).
"""

import dataclasses
import inspect
import json
import math
import os
import re

import pytest

from rlcode import cli, rewards
from rlcode.config import loader
from rlcode.data import chat_prompts, gym_config, sources
from rlcode.data.gym_config import GymConfig
from rlcode.data.reasoning_gym import (GymTasks, from_json, plain_prompt, split_seed,
                                       split_tasks, to_json)
from rlcode.data.tasks import Task, load_tasks
from rlcode.errors import BadInput
import tiny_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "grpo_gym.py")
# Two one-digit terms added: 100 questions, so each split's draws repeat some.
SMALL = {"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                              "max_digits": 1, "operators": ("+",),
                              "allow_parentheses": False, "allow_negation": False}}


def _config(**changes) -> GymConfig:
  fields = dict(datasets=("basic_arithmetic", "leg_counting"), train_size=30,
                validation_size=10, held_out_size=12, seed=3, kwargs=SMALL)
  return GymConfig(**{**fields, **changes})


def _questions(tasks):
  return [t.extra.question for t in tasks]


def test_splits_share_no_question_and_are_deterministic_through_tfds(tmp_path):
  import reasoning_gym
  config = _config()
  made = split_tasks(config)
  assert {k: len(v) for k, v in made.items()} == {"train": 60, "validation": 20,
                                                  "held_out": 24}
  questions = [q for tasks in made.values() for q in _questions(tasks)]
  assert len(set(questions)) == len(questions)
  # The check is not idle: the train split's own draws repeat questions, which were skipped.
  raw = reasoning_gym.create_dataset("basic_arithmetic", **SMALL["basic_arithmetic"],
                                     seed=split_seed(3, "train"), size=30)
  assert len({e["question"] for e in raw}) < 30
  arithmetic = [t for t in made["train"] if t.extra.dataset == "basic_arithmetic"]
  assert arithmetic[-1].extra.index > 29
  for split, tasks in made.items():
    for task in tasks:
      name = task.extra.dataset
      assert task.id == f"gym/{name}/{split}/{task.extra.index:07d}"
      assert task.kind == "gym" and task.prompt == plain_prompt(task.extra.question)
      assert task.prompt.endswith("\nAnswer:") and task.reference == " " + task.extra.answer
      assert task.extra.config["seed"] == split_seed(3, split)

  first = {s: load_tasks(GymTasks(data_dir=str(tmp_path / "a"), config=config), s)
           for s in ("train", "validation", "held_out")}
  again = {s: load_tasks(GymTasks(data_dir=str(tmp_path / "b"), config=_config()), s)
           for s in ("train", "validation", "held_out")}
  assert first == again
  for split, tasks in made.items():
    assert first[split] == sorted(tasks, key=lambda t: t.id)
  # Another seed gives other tasks; held_out does not follow the other splits' sizes.
  other = split_tasks(_config(seed=4))
  assert _questions(other["held_out"]) != _questions(made["held_out"])
  bigger = split_tasks(_config(train_size=40, validation_size=5))
  assert bigger["held_out"] == made["held_out"]


def test_a_warm_start_reads_the_tasks_with_an_answer_only():
  """graph_color checks a coloring by its metadata: no answer, nothing to train on."""
  made = split_tasks(GymConfig(datasets=("graph_color", "leg_counting"), train_size=2,
                               validation_size=0, held_out_size=0))["train"]
  assert [t.extra.dataset for t in made if not t.reference] == ["graph_color"] * 2
  assert sources.with_references(made) == [t for t in made if t.reference] != []


def test_tagged_json_gives_back_tuples_and_non_string_keys():
  value = {"grid": ((1, 2), (3, 4)), "colors": {0: "red", 1: ["blue", (5,)]},
           "__tuple__": "a key like a tag", "nested": [{"x": None, "y": 1.5, "z": True}]}
  encoded = to_json(value)
  assert json.loads(json.dumps(encoded)) == encoded
  back = from_json(json.loads(json.dumps(encoded)))
  assert back == value and isinstance(back["grid"][0], tuple)
  assert list(back["colors"]) == [0, 1] and isinstance(back["colors"][1][1], tuple)
  with pytest.raises(BadInput, match="holds a set"):
    to_json({"a": {1, 2}}, "somewhere")


def test_arc_tasks_keep_their_tuples_through_storage_and_score_their_own_answer():
  """arc_agi compares a parsed answer (tuples) with metadata["output"]: without the tags,
  JSON's lists would score its own answer 0.05."""
  config = GymConfig(datasets=("arc_agi",), train_size=2, validation_size=0, held_out_size=0)
  tasks = [Task.from_example(t.to_example()) for t in split_tasks(config)["train"]]
  assert isinstance(from_json(tasks[0].extra.metadata)["output"], tuple)
  out = rewards.compute({"gym": 1.0}, tasks, [t.reference for t in tasks])
  assert out.scores.tolist() == [1.0, 1.0]


@pytest.mark.slow
def test_every_usable_generator_stores_its_entries_at_its_defaults():
  import reasoning_gym
  usable = sorted(set(gym_config.generators()) - set(gym_config.REFUSED))
  assert len(usable) > 90
  for name in usable:
    dataset = reasoning_gym.create_dataset(name, seed=5, size=2)
    for entry in dataset:
      stored = json.loads(json.dumps(to_json(entry, name)))
      assert from_json(stored) == entry, name


def test_the_refused_generators_are_those_whose_scorer_evaluates_text():
  """reasoning-gym's score_answer sources that call eval/exec/parse_expr/sympify: every one
  is refused but number_sorting's, which evaluates the entry's own answer."""
  call = re.compile(r"\b(eval|exec|parse_expr|sympify)\s*\(")
  evaluating = set()
  for name, (cls, _) in gym_config.generators().items():
    owner = next(c for c in cls.__mro__ if "score_answer" in c.__dict__)
    if call.search(inspect.getsource(owner.__dict__["score_answer"])):
      evaluating.add(name)
  assert evaluating == set(gym_config.EVALUATES_ANSWERS) | {"number_sorting"}


@pytest.fixture(scope="module")
def tasks():
  made = split_tasks(_config(train_size=4, validation_size=0, held_out_size=0))["train"]
  return [Task.from_example(t.to_example()) for t in made]


def test_the_entrys_own_answer_scores_1_in_every_form_the_rule_reads(tasks):
  answers = [t.extra.answer for t in tasks]
  forms = {"auto": [" " + a for a in answers],
           "tags": [f"Let me think.\n<answer>{a}</answer>\n" for a in answers],
           "marker": [f"It is easy.\nAnswer: {a}" for a in answers],
           "whole": [f"\n{a}  " for a in answers]}
  for extract, texts in forms.items():
    out = rewards.compute({"gym": 1.0}, tasks, texts, {"gym": {"extract": extract}})
    assert out.scores.tolist() == [1.0] * len(tasks), extract
    assert out.metrics["gym/parsed"] == 1.0 and out.metrics["gym/correct"] == 1.0
  # "auto": tags first, then the marker; the last of each counts.
  text = f"Answer: 1000\n<answer>1000</answer> then <answer>{answers[0]}</answer> Answer: x"
  assert rewards.compute({"gym": 1.0}, tasks[:1], [text]).scores.tolist() == [1.0]
  # Only the tags when asked for the tags.
  out = rewards.compute({"gym": 1.0}, tasks[:1], [f"Answer: {answers[0]}"],
                        {"gym": {"extract": "tags"}})
  assert out.scores.tolist() == [0.0] and out.metrics["gym/parsed"] == 0.0


def test_a_wrong_answer_scores_0(tasks):
  out = rewards.compute({"gym": 1.0}, tasks, ["<answer>wrong</answer>"] * len(tasks))
  assert out.scores.tolist() == [0.0] * len(tasks)
  assert out.metrics["gym/parsed"] == 1.0 and out.metrics["gym/marked"] == 1.0
  assert out.metrics["gym/correct"] == 0.0


@pytest.mark.parametrize("text", [
    "", "   \n", "Answer:", "<answer></answer>", "<answer>" * 100_000, "</answer>" * 100_000,
    "x" * 2_000_000, "Answer: " + "9" * 5000, "<answer>\udcff\ud800\x00\ufffd</answer>",
    "\x00\x01\x7f\udcfe" * 1000, "Answer: " + "(" * 3000, "Answer: 1e999999",
    "<answer>-nan</answer>", "<answer>" + "\u202e" * 10 + "</answer>",
])
def test_garbage_scores_without_raising(tasks, text):
  out = rewards.compute({"gym": 1.0}, tasks, [text] * len(tasks))
  assert all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in out.scores.tolist())
  # (reasoning-gym's default scorer gives an answer holding the right one, as "1e999999"
  # holds "9", len(right) / len(answer))
  assert out.scores.max() < 1.0 and out.metrics["gym/correct"] == 0.0


def test_the_reward_refuses_other_kinds_and_refused_generators(tasks):
  code = Task(id="c", prompt="def f():", tests="assert True")
  with pytest.raises(BadInput, match="kind 'gym'"):
    rewards.compute({"gym": 1.0}, [code], ["x"])
  countdown = dataclasses.replace(tasks[0], extra=dataclasses.replace(tasks[0].extra,
                                                                      dataset="countdown"))
  with pytest.raises(BadInput, match="evaluates the answer's text"):
    rewards.compute({"gym": 1.0}, [countdown], ["1+1"])


def test_a_chat_template_asks_for_tags_and_the_reward_reads_them(tasks):
  from chat_templates import CHATML
  from rlcode.models.chat_template import ChatTemplate
  chat = chat_prompts.as_chat(tasks[0], ChatTemplate({"default": CHATML}, {}))
  assert chat.prompt.startswith("<|im_start|>user\n" + tasks[0].extra.question)
  assert "<answer></answer>" in chat.prompt and chat.prompt.endswith("assistant\n")
  assert chat.reference == f"<answer>{tasks[0].extra.answer}</answer>"
  assert chat.extra.rendered
  assert rewards.compute({"gym": 1.0}, [chat], [chat.reference]).scores.tolist() == [1.0]


def _one_line(error: Exception, *needles):
  text = str(error)
  assert "\n" not in text, text
  for needle in needles:
    assert needle in text, (needle, text)


@pytest.mark.parametrize("flag, needles", [
    ("--config.data.gym.datasets=('basic_arithmetc',)",
     ("config.data.gym", "no dataset 'basic_arithmetc'", "'basic_arithmetic'")),
    ("--config.data.gym.datasets=('countdown',)", ("'countdown' is refused", "eval")),
    ("--config.data.gym.datasets=()", ("config.data.gym.datasets", "at least one")),
    ("--config.data.gym.train_size=0", ("config.data.gym.train_size=0", "[1, 250000]")),
    ("--config.data.gym.held_out_size=-1", ("config.data.gym.held_out_size=-1", "[0, 250000]")),
    ("--config.data.gym.train_size=many", ("config.data.gym.train_size", "int")),
    ("--config.data.gym.seed=100000", ("config.data.gym.seed=100000", "[0, 1000]")),
    ("--config.data.gym.kwargs.leg_counting.legs=4",
     ("kwargs.leg_counting", "no key 'legs'", "max_animals")),
    ("--config.data.gym.kwargs.leg_counting.min_animals=0",
     ("kwargs.leg_counting", "reasoning-gym refuses it")),
    ("--config.data.gym.kwargs.leg_counting.seed=4", ("kwargs.leg_counting", "'seed'")),
    ("--config.data.gym.kwargs.gcd.min_numbers=2", ("kwargs.gcd", "not one of the datasets")),
    ("--config.data.source=humaneval", ("data.gym is for source 'reasoning_gym'",)),
])
def test_bad_gym_sections_are_one_line(flag, needles):
  with pytest.raises(BadInput) as raised:
    loader.load_config(CONFIG, [flag])
  _one_line(raised.value, *needles)


def test_the_source_needs_its_section():
  with pytest.raises(BadInput) as raised:
    loader.load_config(CONFIG, ["--config.data.gym=None"])
  _one_line(raised.value, "data.gym must be set for source 'reasoning_gym'")


def test_a_generator_with_too_few_questions_is_one_line(tmp_path):
  with pytest.raises(BadInput) as raised:
    load_tasks(GymTasks(data_dir=str(tmp_path), config=_config(train_size=200)), "train")
  _one_line(raised.value, "'basic_arithmetic' gave", "ask for fewer")


@pytest.mark.parametrize("flag, needle", [
    ("--config.data.gym.datasets=('no_such_generator',)", "no dataset 'no_such_generator'"),
    ("--config.data.gym.validation_size=1000000", "config.data.gym.validation_size=1000000"),
])
def test_bad_gym_sections_through_the_cli_exit_2_in_one_line(capsys, tmp_path, flag, needle):
  argv = ["train", "--config", CONFIG, flag, f"--config.workdir={tmp_path / 'run'}"]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err, err
  assert needle in err, err
  assert not os.path.exists(tmp_path / "run")


TINY = tiny_runs.SMALL_JOB


@pytest.mark.slow
def test_the_smoke_job_trains_two_steps(tmp_path):
  workdir = str(tmp_path / "run")
  argv = ["train", "--config", CONFIG + ":smoke", *TINY, f"--config.workdir={workdir}",
          f"--config.data.data_dir={tmp_path / 'tfds'}"]
  assert cli.main(argv) == 0
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  steps = [r for r in rows if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  for r in steps:
    assert math.isfinite(r["loss"]) and math.isfinite(r["reward/gym/mean"])
    assert r["reward_mean"] == pytest.approx(r["reward/gym/mean"])
    assert 0.0 <= r["reward/gym/parsed"] <= 1.0 and r["reward/gym/errors"] == 0.0
  evals = [r for r in rows if "eval/gym/mean" in r]
  assert [r["step"] for r in evals] == [0, 2]
  assert all(r["eval/n_tasks"] == 8 and math.isfinite(r["eval/reward_mean"]) for r in evals)
