"""configs/grpo_diffs.py end to end on a git history made here, and its pieces.

The history's commits are built so that the number of hunk tasks, and which
of them do not fit the test's context (a 2 kB line, a 2.5 kB new file, with the
byte-level tokenizer these tests use), are known by construction.
"""

from __future__ import annotations

import os
import subprocess

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from rlcode.runs import checkpoint
from rlcode.config import loader
from rlcode.policy import sft
from rlcode.parallel import sharding
from rlcode.policy import policy_eval
from rlcode.rl import rollout
from rlcode.train import grpo_loop
from rlcode.policy import warm_start
from rlcode.data.stream import TaskStream
from rlcode.data import edits, sources
from rlcode.data.git import EmptyRepositoryError, MiningConfig, NotARepositoryError, mine
from rlcode.data.tasks import Task
from rlcode.errors import BadInput
from rlcode.runs.metrics import read_metrics
from rlcode.models.build import build_model
from rlcode.models.tokenizer import ByteTokenizer
from rlcode.rewards import diffs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "grpo_diffs.py")
SMALL = [
    "--config.model.tokenizer=bytes", "--config.model.arch.vocab_size=264",
    "--config.data.mining.test_fraction=0.2", "--config.data.mining.validation_fraction=0.2",
    "--config.data.mining.allow_added_files=true", "--config.data.mining.max_changed_lines=5000",
    "--config.model.arch.hidden_size=32", "--config.model.arch.intermediate_size=64",
    "--config.model.arch.num_layers=1", "--config.model.arch.num_heads=2",
    "--config.model.arch.num_kv_heads=1", "--config.model.arch.head_dim=16",
    "--config.model.arch.max_seq_len=2048",
    "--config.rl.prompts_per_step=2", "--config.rl.group_size=2",
    "--config.rl.max_new_tokens=16", "--config.eval.max_new_tokens=16",
    "--config.eval.num_samples=2", "--config.warmstart.steps=2",
    "--config.warmstart.batch_size=2", "--config.train.steps=2",
    "--config.train.checkpoint_every=2", "--config.train.eval_every=2",
    "--config.train.progress_bar=false",
]


class Repo:
  """A git repository in a temp dir; commit k is made at time T0 + 100 k."""

  def __init__(self, path):
    self.path, self.time = path, 1_700_000_000
    path.mkdir(parents=True, exist_ok=True)
    self.git("init", "-q", "-b", "main")

  def git(self, *args: str) -> None:
    stamp = f"@{self.time} +0000"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com", GIT_AUTHOR_DATE=stamp,
               GIT_COMMITTER_DATE=stamp, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    subprocess.run(["git", *args], cwd=self.path, env=env, capture_output=True, check=True)

  def commit(self, message: str, files: dict[str, str]) -> None:
    self.time += 100
    for path, content in files.items():
      (self.path / path).parent.mkdir(parents=True, exist_ok=True)
      (self.path / path).write_text(content)
    self.git("add", "--", *files)
    self.git("commit", "-q", "-m", message)


CART = "".join(f"def price_{i}(x):\n  return x * {i}\n\n" for i in range(1, 9))
UTIL = '"""Helpers."""\n\n\ndef clamp(x, lo, hi):\n  return max(lo, min(x, hi))\n'


def _shop_history(repo: Repo) -> None:
  """Six commits: 4 hunk tasks in the first two (train), 3 in the next two
  (validation), 3 in the last two (test)."""
  repo.commit("Add the shop package", {                      # 3 hunks (new files)
      "shop/cart.py": CART, "shop/util.py": UTIL,
      "shop/data.py": "ROWS = [\n" + "  1,\n" * 600 + "]\n"})  # 2.4 kB answer
  cart = CART.replace("x * 3", "round(x * 3, 2)")
  repo.commit("Round price_3", {"shop/cart.py": cart})       # 1 hunk
  util = UTIL + "\n\ndef tax(x):\n  return x * 0.2\n"
  repo.commit("Add a tax helper", {"shop/util.py": util})    # 1 hunk
  cart = cart.replace("x * 1\n", "x\n")
  repo.commit("Simplify price_1; name the rows", {           # 2 hunks, one 2 kB line
      "shop/cart.py": cart, "shop/data.py": "ROWS = [" + "1, " * 700 + "]\n"})
  cart = cart.replace("x * 2\n", "x + x\n").replace("x * 8\n", "x << 3\n")
  repo.commit("Use cheaper arithmetic", {"shop/cart.py": cart})   # 2 hunks
  repo.commit("Document clamp", {"shop/util.py": util.replace(
      "  return max", '  """x limited to [lo, hi]."""\n  return max')})  # 1 hunk


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
  repo = Repo(tmp_path_factory.mktemp("shop") / "repo")
  _shop_history(repo)
  return repo.path


def _config(shop, tmp_path, *extra, extra_data=True):
  config = loader.load_config(CONFIG, SMALL + [
      f"--config.workdir={tmp_path / 'work'}", f"--config.data.repo={shop}",
      f"--config.data.data_dir={tmp_path / 'data'}", *extra])
  # The warm start's extra data: the same history mined the same way (the real
  # bundles take minutes to mine), so its counts are the training split's.
  with config.unlocked(), config.ignore_type():
    config.warmstart.data = ml_collections.ConfigDict(dict(
        source="git", repo=str(shop), data_dir=str(tmp_path / "data"), train_split="train",
        mining=config.data.mining.to_dict())) if extra_data else None
  return loader.resolve(config)


def _job(config):
  return warm_start.Job.of(config.warmstart, seed=config.seed, model=config.model,
                           data=config.data, rl=config.rl)


def test_warm_start_tasks_add_the_extra_sections_train_split_unless_it_is_off(shop, tmp_path):
  config = _config(shop, tmp_path)
  own = sources.load(config.data, "train")
  tasks, counts = warm_start.warm_start_tasks(_job(config), ByteTokenizer(), 4096, own)
  assert tasks == own + own and counts == {
      "data/warmstart_kept": len(own), "data/warmstart_prompt_too_long": 0,
      "data/warmstart_reference_too_long": 0}
  config = _config(shop, tmp_path, extra_data=False)  # as --config.warmstart.data=None
  assert warm_start.warm_start_tasks(_job(config), ByteTokenizer(), 4096, own) == (own, {})
  # train_repeats weighs the training split against the extra section's.
  config = _config(shop, tmp_path, "--config.warmstart.train_repeats=3")
  tasks, _ = warm_start.warm_start_tasks(_job(config), ByteTokenizer(), 4096, own)
  assert tasks == own * 3 + own
  with pytest.raises(BadInput, match="train_repeats=0"):
    _config(shop, tmp_path, "--config.warmstart.train_repeats=0")


@pytest.mark.slow
def test_grpo_steps_on_a_mined_history(shop, tmp_path):
  grpo_loop.train(_config(shop, tmp_path, "--config.data.test_split=test"))
  rows = read_metrics(str(tmp_path / "work"))
  data = [r for r in rows if "data/train_kept" in r]
  assert data == [{
      "step": 0, "data/train_kept": 3, "data/train_prompt_too_long": 0,
      "data/train_reference_too_long": 1, "data/eval_kept": 2,
      "data/eval_prompt_too_long": 1, "data/eval_reference_too_long": 0,
      "data/test_kept": 3, "data/test_prompt_too_long": 0, "data/test_reference_too_long": 0,
      "data/warmstart_kept": 3, "data/warmstart_prompt_too_long": 0,
      "data/warmstart_reference_too_long": 1}]
  steps = [r for r in rows if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  for r in steps:
    for key in ("loss", "entropy", "grad_norm", "tokens_per_s"):
      assert np.isfinite(r[key]), key
    # 16 bytes cannot hold <think>..</think><solution>..</solution>: every
    # answer is a format error, scored -1 by the diff reward.
    assert r["reward_mean"] == -1.0 and r["reward/diff/format_valid"] == 0.0
    assert r["groups_with_signal"] == 0.0
  evals = [r for r in rows if "eval/reward_mean" in r]
  assert [r["step"] for r in evals] == [0, 2]
  for r in evals:
    # The validation split every eval row covers; the test split the first and the last.
    assert r["eval/n_tasks"] == 2 and r["eval/n_samples"] == 4
    assert r["test/n_tasks"] == 3 and r["test/n_samples"] == 6
    for split in ("eval", "test"):
      assert r[f"{split}/reward_mean"] == -1.0 and r[f"{split}/diff/success_rate"] == 0.0
      assert r[f"{split}/diff/format_valid"] == 0.0 and r[f"{split}/diff/exact"] == 0.0
      assert r[f"{split}/diff/reward_mean"] == -1.0


@pytest.mark.slow
def test_warm_start_cache_is_reused_for_the_same_key_only(shop, tmp_path, monkeypatch):
  only_warm_start = ["--config.train.steps=0", "--config.train.eval_every=0",
                     f"--config.warmstart.cache_dir={tmp_path / 'cache'}"]
  first = _config(shop, tmp_path / "a", *only_warm_start)
  grpo_loop.train(first)
  [key] = os.listdir(tmp_path / "cache")
  assert key == warm_start.warm_start_key(_job(first))
  # `rlcode eval --checkpoint` reads a cache entry (the parameters alone) as it reads the
  # workdir's warm_start/ (a whole train state): the same policy.
  mesh = sharding.mesh_from_config(first.mesh)
  recipe = policy_eval.Recipe.of(first.model, first.optimizer, first.rl, first.seed)
  cached, _, _, _ = policy_eval.restore_policy(recipe, str(tmp_path / "cache" / key), mesh)
  kept, _, _, _ = policy_eval.restore_policy(recipe, str(tmp_path / "a" / "work" / "warm_start"),
                                             mesh)
  for a, b in zip(jax.tree.leaves(nnx.state(cached, nnx.Param)),
                  jax.tree.leaves(nnx.state(kept, nnx.Param)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # ... and it is the warm-started policy, not the initial weights both would build.
  initial, _ = build_model(first.model, mesh, first.seed)
  assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
      jax.tree.leaves(nnx.state(cached, nnx.Param)), jax.tree.leaves(nnx.state(initial, nnx.Param))))

  def refuse(*args, **kwargs):
    raise AssertionError("the warm start ran again")

  monkeypatch.setattr(sft, "make_sft_step", refuse)
  # The same warm start (the evaluation splits and the workdir do not change it): loaded.
  again = _config(shop, tmp_path / "b", *only_warm_start, "--config.data.test_split=test")
  assert warm_start.warm_start_key(_job(again)) == key
  grpo_loop.train(again)
  sft_rows = [[r for r in read_metrics(str(tmp_path / d / "work")) if "sft_loss_last" in r]
              for d in ("a", "b")]
  assert sft_rows[0] == sft_rows[1] and len(sft_rows[0]) == 1
  # Another seed is another warm start: it must train.
  other = _config(shop, tmp_path / "c", *only_warm_start, "--config.seed=1")
  assert warm_start.warm_start_key(_job(other)) != key
  with pytest.raises(AssertionError, match="ran again"):
    grpo_loop.train(other)
  # Unless the warm start has a seed of its own: then run seeds 0 and 1 share it.
  shared = _config(shop, tmp_path / "d", *only_warm_start, "--config.seed=1",
                   "--config.warmstart.seed=0")
  assert _job(shared).seed == 0 and warm_start.warm_start_key(_job(shared)) == key
  grpo_loop.train(shared)
  assert [r for r in read_metrics(str(tmp_path / "d" / "work")) if "sft_loss_last" in r] == \
      sft_rows[0]


def test_repo_that_is_not_a_repository_or_empty(tmp_path):
  plain = tmp_path / "plain"
  plain.mkdir()
  with pytest.raises(NotARepositoryError, match="is not a git repository"):
    sources.builder(_config(plain, tmp_path).data)
  empty = Repo(tmp_path / "empty").path
  with pytest.raises(EmptyRepositoryError, match="has no commits"):
    sources.builder(_config(empty, tmp_path).data)


def test_repository_named_twice_is_an_error(shop, tmp_path):
  # The repository is config.data.repo; mining has no source of its own.
  with pytest.raises(KeyError, match="mining has no key 'source'"):
    _config(shop, tmp_path, f"--config.data.mining.source={shop}")


def _file_section(prompt: str, path: str) -> str:
  start = prompt.index(f"### {path}\n") + len(f"### {path}\n")
  return prompt[start:prompt.index("\n--- END FILE ---", start)]


def test_excerpts_show_the_lines_near_each_change(tmp_path):
  repo = Repo(tmp_path / "repo")
  lines = [f"line {i}\n" for i in range(1, 31)]
  block = ["p\n"] * 4 + ["q\n"] + ["p\n"] * 4
  twice = ["head\n"] + block + ["sep\n"] + block + ["tail\n"]
  repo.commit("Add", {"a.py": "".join(lines), "b.py": "".join(twice)})
  lines[14] = "line fifteen\n"
  twice[15] = "r\n"
  repo.commit("Change", {"a.py": "".join(lines), "b.py": "".join(twice)})
  tasks = mine(MiningConfig(source=str(repo.path), granularity="hunk", context_lines=3,
                            test_fraction=0.0)).splits["train"]
  changed = {t.id.split(":")[1]: t for t in tasks if "Change" in t.prompt}
  # a.py: line 15 changed, 3 lines either side shown (12-18).
  a = changed["a.py#1"]
  assert _file_section(a.prompt, "a.py") == (
      "[... lines 1-11 not shown ...]\n" + "".join(f"line {i}\n" for i in range(12, 15))
      + "line 15\n" + "".join(f"line {i}\n" for i in range(16, 19))
      + "[... lines 19-30 not shown ...]")
  assert "b.py" not in a.prompt and "APPLIED CHANGES" not in a.prompt
  # b.py: the reference's SEARCH must reach "sep" and "tail" (lines 11 and 21)
  # to be unique, so the window doubles to 6 lines: 10-21.
  b = changed["b.py#1"]
  search = edits.parse_search_replace(edits.extract_thought_solution(b.reference)[1])
  assert search["b.py"][0][0] == "".join(twice[10:15] + ["q\n"] + twice[16:]).rstrip("\n")
  assert _file_section(b.prompt, "b.py") == (
      "[... lines 1-9 not shown ...]\n" + "p\n" + "sep\n" + "".join(block) + "tail")
  # The reward still sees whole files.
  assert b.extra.files["b.py"] == "".join(twice[:15] + ["q\n"] + twice[16:])


def test_line_edit_excerpts_number_the_shown_lines(tmp_path):
  repo = Repo(tmp_path / "repo")
  lines = [f"line {i}\n" for i in range(1, 31)]
  repo.commit("Add", {"a.py": "".join(lines)})
  lines[14] = "line fifteen\n"
  repo.commit("Change", {"a.py": "".join(lines)})
  task, = [t for t in mine(MiningConfig(
      source=str(repo.path), granularity="hunk", context_lines=3, edit_format="line_edit",
      oracle_context_lines=0, test_fraction=0.0)).splits["train"] if "Change" in t.prompt]
  assert _file_section(task.prompt, "a.py") == (
      "[... lines 1-11 not shown ...]\n" + "".join(f"{i}|line {i}\n" for i in range(12, 19))
      + "[... lines 19-30 not shown ...]")
  assert "### a.py\n<<<<<<< LINES 15-15\nline fifteen\n>>>>>>> REPLACE" in task.reference
  # Whole files (context_lines=0) are numbered too.
  task, = [t for t in mine(MiningConfig(
      source=str(repo.path), granularity="hunk", edit_format="line_edit",
      test_fraction=0.0)).splits["train"] if "Change" in t.prompt]
  assert _file_section(task.prompt, "a.py") == "".join(
      f"{i}|line {i}\n" for i in range(1, 31)).rstrip("\n")


def test_an_open_file_task_leaves_the_path_out_and_is_scored_with_it(tmp_path):
  repo = Repo(tmp_path / "repo")
  lines = [f"line {i}\n" for i in range(1, 31)]
  repo.commit("Add", {"a.py": "".join(lines), "b.py": "b\n"})
  lines[14] = "line fifteen\n"
  repo.commit("Change", {"a.py": "".join(lines), "b.py": "B\n"})
  for name in ("open_file", "line_counts"):
    with pytest.raises(ValueError, match=f"{name} needs edit_format='line_edit'"):
      MiningConfig(source=str(repo.path), **{name: True})
  splits = mine(MiningConfig(
      source=str(repo.path), granularity="hunk", context_lines=3, edit_format="line_edit",
      oracle_context_lines=0, test_fraction=0.0, open_file=True)).splits["train"]
  task, = [t for t in splits if "Change" in t.prompt and "a.py" in t.extra.oracle]
  assert task.extra.open_file == "a.py"
  assert task.reference.endswith("<solution>\n<<<<<<< LINES 15-15\nline fifteen\n"
                                 ">>>>>>> REPLACE\n</solution>")
  reward = diffs.diff_reward([task, task], [task.reference,
                                            task.reference.replace("fifteen", "XV")])
  assert reward.metrics["format_valid"] == 1.0 and reward.metrics["exact"] == 0.5
  # A PR unit that shows both files has no open file: its blocks name their paths.
  pr_task, = [t for t in mine(MiningConfig(
      source=str(repo.path), granularity="pr", context_lines=3, edit_format="line_edit",
      oracle_context_lines=0, test_fraction=0.0, open_file=True)).splits["train"]
      if "Change" in t.prompt]
  assert pr_task.extra.open_file == "" and "### a.py\n<<<<<<<" in pr_task.reference
  # References by first line and length (line_counts).
  task, = [t for t in mine(MiningConfig(
      source=str(repo.path), granularity="hunk", context_lines=3, edit_format="line_edit",
      oracle_context_lines=0, test_fraction=0.0, open_file=True, line_counts=True)
  ).splits["train"] if "Change" in t.prompt and "a.py" in t.extra.oracle]
  assert "<<<<<<< LINES 15+1\nline fifteen\n>>>>>>> REPLACE" in task.reference
  assert diffs.diff_reward([task], [task.reference]).metrics["exact"] == 1.0


def test_a_task_whose_ranges_count_the_shown_lines_is_scored_through_them(tmp_path):
  """MiningConfig.line_numbers='shown': the prompt numbers its shown lines 1..K, the
  reference's ranges count them, extra.shown_lines maps them back for the rewards."""
  repo = Repo(tmp_path / "repo")
  lines = [f"line {i}\n" for i in range(1, 31)]
  repo.commit("Add", {"a.py": "".join(lines)})
  lines[14] = "line fifteen\n"
  repo.commit("Change", {"a.py": "".join(lines)})
  options = dict(source=str(repo.path), granularity="hunk", context_lines=3,
                 edit_format="line_edit", oracle_context_lines=0, test_fraction=0.0,
                 open_file=True, line_counts=True)
  shown_task, = [t for t in mine(MiningConfig(**options, line_numbers="shown")
                                 ).splits["train"] if "Change" in t.prompt]
  task = shown_task
  assert _file_section(task.prompt, "a.py") == (
      "[... 11 lines not shown ...]\n"
      + "".join(f"{k}|line {i}\n" for k, i in enumerate(range(12, 19), 1))
      + "[... 12 lines not shown ...]")
  assert task.extra.shown_lines == {"a.py": list(range(12, 19))}
  assert "<<<<<<< LINES 4+1\nline fifteen\n>>>>>>> REPLACE" in task.reference
  # The file's own number (15) is past the 7 shown lines: a format error, not an edit.
  reward = diffs.diff_reward([task, task], [task.reference,
                                            task.reference.replace("LINES 4+1", "LINES 15+1")])
  assert list(reward.scores) == [1.0, -1.0] and reward.metrics["exact"] == 0.5
  # The default keeps the files' numbers and records no map.
  task, = [t for t in mine(MiningConfig(**options)).splits["train"] if "Change" in t.prompt]
  assert task.extra.shown_lines is None and "LINES 15+1" in task.reference
  with pytest.raises(ValueError, match="line_numbers='bogus'"):
    MiningConfig(**options, line_numbers="bogus")
  with pytest.raises(ValueError, match="needs edit_format='line_edit'"):
    MiningConfig(source=str(repo.path), line_numbers="shown")
  with pytest.raises(ValueError, match="reference_thought='locate'"):
    MiningConfig(**options, line_numbers="shown", reference_thought="locate")
  # The warm start's renumbering shifts the files' numbers, which such a task has not.
  with pytest.raises(ValueError, match="leave warmstart.renumber at 0"):
    sft.renumber(3)([shown_task], np.random.default_rng(0))


def test_fit_context_counts():
  tok = ByteTokenizer()  # one token per byte, plus a BOS on encode
  tasks = [Task(id=str(i), prompt="p" * n, kind="diff", reference="r" * m)
           for i, (n, m) in enumerate([(10, 5), (12, 5), (10, 9), (11, 7), (3, 0)])]
  # Context 20, 8 new tokens: a prompt of n bytes needs n + 1 + 8 <= 20, and
  # its reference of m bytes n + 1 + m + 1 <= 20 (task 3 is at both limits).
  kept, counts = rollout.fit_context(tasks, tok, max_seq_len=20, max_new_tokens=8)
  assert [t.id for t in kept] == ["0", "3", "4"]
  assert counts == {"kept": 3, "prompt_too_long": 1, "reference_too_long": 1}


def test_length_buckets_visit_every_task_once_an_epoch_in_batches_of_like_lengths():
  tok = ByteTokenizer()
  rng = np.random.default_rng(0)
  tasks = [Task(id=str(i), prompt="p" * int(rng.integers(5, 200)), kind="diff",
                reference="r" * int(rng.integers(1, 50))) for i in range(96)]
  length = {t.id: len(t.prompt) + len(t.reference) for t in tasks}
  spread = lambda batches: np.mean([max(length[t.id] for t in b) - min(length[t.id] for t in b)
                                    for b in batches])
  stream = sft.LengthBuckets(tasks, tok, batch_size=4, seed=3, pool=8)
  epochs = [[stream.next() for _ in range(24)] for _ in range(2)]
  for batches in epochs:  # 96 tasks = 24 batches of 4 = 3 pools of 8 batches
    assert all(len(b) == 4 for b in batches)
    assert sorted(t.id for b in batches for t in b) == sorted(t.id for t in tasks)
  plain = TaskStream(tasks, 4, seed=3)
  assert spread(epochs[0]) < 0.5 * spread([plain.next() for _ in range(24)])
  # Seeded: the same batches in the same order; a pool of 1 is the plain stream's batches.
  again = sft.LengthBuckets(tasks, tok, batch_size=4, seed=3, pool=8)
  assert [[t.id for t in again.next()] for _ in range(24)] == [[t.id for t in b] for b in epochs[0]]
  one, plain = sft.LengthBuckets(tasks, tok, 4, seed=5, pool=1), TaskStream(tasks, 4, 5)
  for _ in range(30):
    assert {t.id for t in one.next()} == {t.id for t in plain.next()}
  with pytest.raises(ValueError, match="pool must be >= 1"):
    sft.LengthBuckets(tasks, tok, 4, seed=0, pool=0)


def test_renumber_shifts_line_edit_rows_afresh_at_each_visit():
  prompt = edits.build_prompt("Fix it.", {"f.py": edits.omitted_lines(1, 4) + "5|a\n6|b\n"},
                              "line_edit", instructions=False)
  reference = "<think>\nx\n</think>\n<solution>\n<<<<<<< LINES 6+1\nB\n>>>>>>> REPLACE\n</solution>"
  line = Task(id="l", prompt=prompt, kind="diff", reference=reference,
              extra={"edit_format": "line_edit"})
  other = Task(id="s", prompt="5|a\n", kind="diff", reference="LINES 5+1",
               extra={"edit_format": "search_replace"})
  augment, rng = sft.renumber(30), np.random.default_rng(0)
  offsets = []
  for _ in range(40):
    shifted, same = augment([line, other], rng)
    assert same is other and shifted.id == "l" and shifted.extra == line.extra
    k = int(shifted.reference.split("LINES ")[1].split("+")[0]) - 6
    assert (shifted.prompt, shifted.reference) == edits.shift_line_numbers(prompt, reference, k)
    offsets.append(k)
  assert min(offsets) >= 0 and max(offsets) <= 30 and len(set(offsets)) > 10
  again = sft.renumber(30)
  rng = np.random.default_rng(0)
  assert [again([line], rng)[0].reference for _ in range(5)] == [
      edits.shift_line_numbers(prompt, reference, k)[1] for k in offsets[:5]]
  with pytest.raises(ValueError, match="max_offset"):
    sft.renumber(-1)


def test_checkpoint_under_a_relative_workdir(tmp_path, monkeypatch):
  # The configs' workdirs are relative ("workdirs/grpo_diffs"); orbax needs absolute paths.
  monkeypatch.chdir(tmp_path)
  ckpt = checkpoint.Checkpointer("workdirs/x/checkpoints")
  ckpt.save(1, {"w": np.arange(3.0)}, {"seed": 0})
  ckpt.wait()
  state, meta, step = ckpt.restore({"w": jax.ShapeDtypeStruct((3,), np.float64)})
  ckpt.close()
  assert step == 1 and meta == {"seed": 0}
  np.testing.assert_array_equal(state["w"], np.arange(3.0))


def test_several_repositories_mine_alike_and_merge_by_id(shop, tmp_path):
  other = Repo(tmp_path / "other")
  other.commit("Add", {"m.py": "a = 1\n"})
  other.commit("Bump a", {"m.py": "a = 2\n"})
  other.commit("Bump a again", {"m.py": "a = 3\n"})
  one = lambda repo: _config(repo, tmp_path).data
  both = _config(shop, tmp_path).data
  with both.unlocked():
    del both["repo"]
    both.repo = (str(shop), str(other.path))
  assert len(sources.builders(both)) == 2
  for split in ("train", "validation", "test"):
    merged = sources.load(both, split)
    alone = sources.load(one(shop), split) + sources.load(one(other.path), split)
    assert merged == sorted(alone, key=lambda t: t.id)
    assert {t.extra.pr for t in merged} == {t.extra.pr for t in alone}
  with both.unlocked():
    both.repo = ()
  with pytest.raises(ValueError, match="empty tuple"):
    sources.load(both, "train")
