"""`rlcode export`: a run's policy out as a Hugging Face directory, and back in.

For a bfloat16 Qwen3 checkpoint with yarn rope, a run on a tiny checkpoint (tests/tiny_hf.py: the weights of
tests/data/hf plus a tokenizer and a chat template), its parameters perturbed so that an
export of the base would not pass, saved as the run's checkpoint; `rlcode export` writes
it out; transformers (torch) loads the directory and its logits equal rlcode's within
1e-4, and rlcode loads it back exactly. A byte-tokenizer run from scratch exports a
tokenizer.json that encodes as ours; a LoRA run exports merged weights or a PEFT adapter.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import tiny_hf
from rlcode import cli
from rlcode.config import loader, record
from rlcode.models import build, load_hf, lora, peft
from rlcode.parallel import sharding
from rlcode.runs import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The command's path end to end on the storage variant furthest from the run's (bfloat16
# weights, a rope with scaling); every family's tensors and config round-trip through
# transformers in tests/test_model_families.py.
CASES = ["qwen3_yarn_bf16"]


def _run(tmp_path, *overrides):
  """A workdir holding a run's config and a perturbed policy as its step-3 checkpoint."""
  workdir = str(tmp_path / "run")
  config = loader.load_config(os.path.join(ROOT, "configs", "grpo_tiny.py"),
                              [f"--config.workdir={workdir}", *overrides])
  model, _ = build.build_model(config.model, sharding.make_mesh(), config.seed)
  # What training moves: every parameter, or a LoRA run's adapters alone.
  graphdef, trained, frozen = nnx.split(model, lora.trainable(model.cfg), ...)
  leaves, tree = jax.tree.flatten(trained)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  moved = [x + (0.01 * jax.random.normal(k, x.shape)).astype(x.dtype)
           for k, x in zip(keys, leaves)]
  model = nnx.merge(graphdef, jax.tree.unflatten(tree, moved), frozen)
  graphdef, params = nnx.split(model, nnx.Param)
  record.write_run_config(config, workdir)
  checkpoint.save_once(os.path.join(workdir, "checkpoints"), 3, params, {})
  return workdir, nnx.merge(graphdef, params)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_export_loads_in_transformers_and_back(case, tmp_path):
  import torch  # the dev extra; the check needs transformers' model
  import transformers
  base = tiny_hf.checkpoint(case, tmp_path)
  workdir, trained = _run(tmp_path, f"--config.model.hf_path={base}")
  out = str(tmp_path / "exported")
  assert cli.main(["export", workdir, "--out", out]) == 0
  for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json"):
    assert os.path.isfile(os.path.join(out, name)), name
  ids = json.load(open(os.path.join(base, "refs.json")))["input_ids"]
  ours = np.asarray(trained(jnp.asarray(ids, jnp.int32)), np.float32)
  theirs_model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
  with torch.no_grad():
    theirs = theirs_model(torch.tensor(ids)).logits.numpy()
  if trained.cfg.param_dtype == "float32":
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
  else:  # a bfloat16 run: transformers computes in float32 from the same bf16 weights
    f32, _ = load_hf(out, param_dtype="float32", dtype="float32")
    np.testing.assert_allclose(theirs, np.asarray(f32(jnp.asarray(ids, jnp.int32))),
                               atol=1e-4, rtol=0)
  again, cfg = load_hf(out)
  assert cfg == trained.cfg
  np.testing.assert_array_equal(np.asarray(again(jnp.asarray(ids, jnp.int32))), ours)
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                 add_generation_prompt=True).endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_a_byte_tokenizer_run_exports_a_tokenizer_that_encodes_as_ours(tmp_path):
  from tokenizers import Tokenizer
  from rlcode.models import ByteTokenizer
  workdir, _ = _run(tmp_path)
  out = str(tmp_path / "exported")
  assert cli.main(["export", workdir, "--out", out]) == 0
  theirs = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
  ours = ByteTokenizer()
  for text in ["def f(x):\n  return x", "héllo ✓ 日本", ""]:
    assert theirs.encode(text).ids == ours.encode(text)
  assert json.load(open(os.path.join(out, "config.json")))["model_type"] == "qwen2"


@pytest.mark.slow
def test_a_lora_run_exports_merged_weights_or_an_adapter(tmp_path):
  base = tiny_hf.checkpoint("qwen3", tmp_path)
  workdir, trained = _run(tmp_path, f"--config.model.hf_path={base}", "--config.model.lora.rank=4")
  merged_dir, adapter_dir = str(tmp_path / "merged"), str(tmp_path / "adapter")
  assert cli.main(["export", workdir, "--out", merged_dir]) == 0
  assert cli.main(["export", workdir, "--out", adapter_dir, "--peft"]) == 0
  ids = jnp.asarray([[5, 9, 30, 41, 52, 63]], jnp.int32)
  merged, cfg = load_hf(merged_dir)
  assert cfg.lora is None
  np.testing.assert_allclose(np.asarray(merged(ids)), np.asarray(trained(ids)), atol=1e-5)
  base_model, _ = load_hf(base, lora=dict(rank=4))
  adapted = peft.load_peft(base_model, adapter_dir)
  np.testing.assert_allclose(np.asarray(adapted(ids)), np.asarray(trained(ids)), atol=1e-5)


def test_export_refuses_in_one_line(tmp_path, capsys):
  assert cli.main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 2
  assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _recorded_run(tmp_path):
  """A workdir holding only a run's recorded config: enough for export's checks, which
  come before the restore."""
  workdir = str(tmp_path / "run")
  record.write_run_config(loader.load_config(os.path.join(ROOT, "configs", "grpo_tiny.py"),
                                             [f"--config.workdir={workdir}"]), workdir)
  return workdir


def _under_a_file(tmp_path):
  (tmp_path / "file").write_text("x")
  return str(tmp_path / "file" / "out")


def _a_file(tmp_path):
  (tmp_path / "out").write_text("x")
  return str(tmp_path / "out")


def _not_empty(tmp_path):
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "keep").write_text("x")
  return str(tmp_path / "out")


@pytest.mark.parametrize("where,says", [
    (_under_a_file, "cannot write there (Not a directory"),
    (_a_file, "exists and is not a directory"),
    (_not_empty, "exists and is not empty"),
], ids=["under_a_file", "a_file", "not_empty"])
def test_export_refuses_a_destination_before_the_restore(where, says, tmp_path, capsys,
                                                         monkeypatch):
  from rlcode.policy import policy_eval
  workdir, out = _recorded_run(tmp_path), where(tmp_path)
  monkeypatch.setattr(policy_eval, "restore_policy", None)  # reached: a TypeError
  assert cli.main(["export", workdir, "--out", out]) == 2
  err = capsys.readouterr().err.strip()
  assert says in err and out in err and "\n" not in err


def test_an_unlistable_destination_is_one_line(tmp_path, capsys, monkeypatch):
  """--out a directory its user may enter but not read (mode 0o300): listing it was a
  PermissionError traceback."""
  from rlcode.policy import policy_eval
  workdir, out = _recorded_run(tmp_path), tmp_path / "out"
  out.mkdir()
  out.chmod(0o300)
  if os.geteuid() == 0:  # root lists any directory: it fails as it does for a user
    listdir = os.listdir

    def unlistable(path="."):
      if os.fspath(path) == str(out):
        raise PermissionError(13, "Permission denied", str(out))
      return listdir(path)
    monkeypatch.setattr(os, "listdir", unlistable)
  monkeypatch.setattr(policy_eval, "restore_policy", None)  # reached: a TypeError
  try:
    assert cli.main(["export", workdir, "--out", str(out)]) == 2
  finally:
    out.chmod(0o700)
  err = capsys.readouterr().err.strip()
  assert "cannot list it (Permission denied)" in err and str(out) in err and "\n" not in err


def test_export_into_a_new_nested_directory_writes_it(tmp_path, monkeypatch):
  """The positive control of the check: a missing parent is made, and the restore reached."""
  from rlcode.policy import policy_eval

  class Reached(Exception):
    pass

  def restore(*args):
    raise Reached
  monkeypatch.setattr(policy_eval, "restore_policy", restore)
  out = tmp_path / "a" / "b"
  with pytest.raises(Reached):
    cli.main(["export", _recorded_run(tmp_path), "--out", str(out)])
  assert out.is_dir() and not list(out.iterdir())


def test_a_failed_write_is_one_line(tmp_path, capsys, monkeypatch):
  import errno

  from rlcode.models import hf
  workdir, _ = _run(tmp_path, "--config.model.arch.hidden_size=32",
                    "--config.model.arch.intermediate_size=64",
                    "--config.model.arch.num_layers=1", "--config.model.arch.num_heads=2",
                    "--config.model.arch.num_kv_heads=2", "--config.model.arch.head_dim=16")
  out = str(tmp_path / "out")

  def full(model, directory, **kw):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                  os.path.join(directory, "model.safetensors"))
  monkeypatch.setattr(hf, "save_hf", full)
  assert cli.main(["export", workdir, "--out", out]) == 2
  err = capsys.readouterr().err.strip()
  assert "No space left on device" in err and "model.safetensors" in err and "\n" not in err

  # safetensors' own writer reports a full disk as a SafetensorError, not an OSError.
  from safetensors import SafetensorError

  def full_tensors(tensors, filename, metadata=None):
    raise SafetensorError("Error while serializing: I/O error: No space left on device "
                          "(os error 28)")
  monkeypatch.undo()
  monkeypatch.setattr(hf, "save_file", full_tensors)
  out = str(tmp_path / "out2")
  assert cli.main(["export", workdir, "--out", out]) == 2
  err = capsys.readouterr().err.strip()
  assert "No space left on device" in err and "\n" not in err and "Traceback" not in err
