"""Config files, overrides and the command line."""

import json
import os
import subprocess
import sys

import ml_collections
import pytest

import xla_flags
from rlcode.config import loader
from rlcode.models import ByteTokenizer, HFTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "configs", "sample_tiny.py")


def test_overrides_parse_as_the_type_they_replace():
  cfg = loader.load_config(SAMPLE, [
      "--config.sampling.temperature=0", "--config.sampling.max_new_tokens=8",
      "--config.model.arch.qkv_bias=false", "--config.workdir=/tmp/x",
      "--config.prompts=('a', 'b')"])
  assert cfg.sampling.temperature == 0.0 and isinstance(cfg.sampling.temperature, float)
  assert cfg.sampling.max_new_tokens == 8
  assert cfg.model.arch.qkv_bias is False
  assert cfg.workdir == "/tmp/x" and cfg.prompts == ("a", "b")


def test_unknown_key_names_the_valid_keys():
  with pytest.raises(KeyError, match=r"sampling has no key 'temprature'; valid keys: "
                                     r"\['group_size', 'max_new_tokens', 'temperature'"):
    loader.load_config(SAMPLE, ["--config.sampling.temprature=0.5"])
  with pytest.raises(KeyError, match="config has no key 'nope'"):
    loader.load_config(SAMPLE, ["--config.nope=1"])


def test_wrong_types_and_shapes_fail():
  with pytest.raises(ValueError, match="cannot parse as int"):
    loader.load_config(SAMPLE, ["--config.sampling.max_new_tokens=abc"])
  with pytest.raises(ValueError, match="expected a boolean"):
    loader.load_config(SAMPLE, ["--config.model.arch.qkv_bias=maybe"])
  with pytest.raises(KeyError, match="is a group of keys"):
    loader.load_config(SAMPLE, ["--config.sampling=1"])
  with pytest.raises(FileNotFoundError):
    loader.load_config("configs/none.py")


def test_the_diff_warm_starts_practice_data_is_mined_as_the_tasks_are():
  # configs/grpo_diffs.py's warmstart.data: the practice history, its answer format
  # following config.data.mining's through overrides, all of it train, no tests; None
  # turns it off.
  path = os.path.join(ROOT, "configs", "grpo_diffs.py")
  assert loader.load_config(path).warmstart.data.source == "git"
  assert loader.load_config(path, ["--config.warmstart.data=None"]).warmstart.data is None
  for value in (False, True):
    cfg = loader.load_config(path, [f"--config.data.mining.line_counts={value}",
                                        f"--config.data.mining.open_file={value}"])
    practice = cfg.warmstart.data.mining
    assert practice.line_counts is value and practice.open_file is value
    assert practice.edit_format == cfg.data.mining.edit_format == "line_edit"
    assert (practice.test_fraction, practice.validation_fraction) == (0.0, 0.0)
    assert practice.tests_hidden == practice.tests_visible == practice.tests_support == ()
    assert os.path.isfile(os.path.join(ROOT, cfg.warmstart.data.repo))
  cfg = loader.load_config(path, ["--config.data.mining.context_lines=5"])
  assert cfg.warmstart.data.mining.context_lines == 5


# Every config but the shared pieces, the plans, whose models are only costed by
# `rlcode plan` (Qwen2's vocabulary, never built with a tokenizer here), and the configs of
# Hub checkpoints, which bring their own tokenizer (tests/test_chat_configs.py runs them).
HUB_CONFIGS = ("chat_grpo.py",)


@pytest.mark.parametrize("name", sorted(
    n for n in os.listdir(os.path.join(ROOT, "configs"))
    if n.endswith(".py") and n != "common.py" and not n.endswith("_plan.py")
    and n not in HUB_CONFIGS))
def test_a_configs_tokenizer_fits_its_models_vocabulary(name, monkeypatch):
  """Every id the tokenizer can write has an embedding row (padding rows may follow)."""
  from rlcode.models.tokenizer import load_tokenizer
  monkeypatch.chdir(ROOT)  # configs name tokenizers relative to the repository
  cfg = loader.load_config(os.path.join(ROOT, "configs", name), [])
  assert not cfg.model.hf_path
  tok = load_tokenizer(cfg.model.get("tokenizer") or "bytes")
  assert tok.vocab_size <= cfg.model.arch.vocab_size < tok.vocab_size + 64


def test_config_is_locked():
  cfg = loader.load_config(SAMPLE)
  with pytest.raises(AttributeError):
    cfg.new_key = 1
  assert isinstance(cfg, ml_collections.ConfigDict)


@pytest.mark.slow
def test_cli_sample_runs_and_writes_jsonl(tmp_path):
  env = dict(os.environ, XLA_FLAGS=xla_flags.for_subprocess(), PYTHONPATH=ROOT)
  proc = subprocess.run(
      [sys.executable, "-m", "rlcode", "sample", "--config", SAMPLE,
       f"--config.workdir={tmp_path}", "--config.sampling.max_new_tokens=8",
       "--config.sampling.group_size=2"],
      capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
  assert proc.returncode == 0, proc.stderr
  rows = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
  assert len(rows) == 6 and all(len(r["tokens"]) <= 8 for r in rows)
  bad = subprocess.run([sys.executable, "-m", "rlcode", "sample", "--config", SAMPLE,
                        "--config.sampling.nope=1"], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=300)
  assert bad.returncode != 0 and "valid keys" in bad.stderr


def test_byte_tokenizer_round_trips():
  tok = ByteTokenizer()
  text = "def f(x):\n    return 'héllo' + x  # ✓"
  ids = tok.encode(text)
  assert ids[0] == tok.bos_id and max(ids) < tok.vocab_size
  assert tok.decode(ids) == text


def test_hf_tokenizer_from_tokenizer_json(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["def add(a, b):\n    return a + b\n"] * 20, trainer)
  tok.save(str(tmp_path / "tokenizer.json"))
  json.dump({"eos_token_id": 1}, open(tmp_path / "generation_config.json", "w"))
  hf = HFTokenizer(str(tmp_path))
  text = "def add(x, y):\n    return x + y\n"
  assert hf.decode(hf.encode(text)) == text
  assert hf.eos_ids == (1,) and hf.pad_id == 1
  with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
    HFTokenizer(str(tmp_path / "missing"))


def test_the_cli_turns_on_the_persistent_compilation_cache_unless_told_otherwise(
    tmp_path, monkeypatch):
  """`rlcode` caches compiled programs under ~/.cache/rlcode/jax for itself and the
  processes it starts; where JAX_COMPILATION_CACHE_DIR is set (empty: off), nothing of
  JAX's cache settings is touched."""
  import jax

  from rlcode import cli
  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  before = {k: jax.config.values[k] for k in keys}
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "")
  try:
    cli.compilation_cache()
    assert {k: jax.config.values[k] for k in keys} == before
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    cli.compilation_cache()
    want = str(tmp_path / ".cache" / "rlcode" / "jax")
    assert jax.config.values["jax_compilation_cache_dir"] == want
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == want
    assert jax.config.values["jax_persistent_cache_min_compile_time_secs"] == 0.2
  finally:
    for k, v in before.items():
      jax.config.update(k, v)
