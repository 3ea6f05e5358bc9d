"""The decoder against transformers' outputs, and Hugging Face checkpoints in and out."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rlcode.parallel import sharding
from rlcode.models import HFTokenizer, hf, load_hf, save_hf
from rlcode.models.config import ModelConfig
from rlcode.models.hf_config import from_hf_config
from rlcode.sampling import generate

TINY = os.path.join(os.path.dirname(__file__), "data", "qwen2_tiny")


@pytest.fixture(scope="module")
def ref():
  with open(os.path.join(TINY, "logits_ref.json")) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def tiny():
  return load_hf(TINY)


def test_logits_match_transformers(tiny, ref):
  model, cfg = tiny
  assert cfg.qkv_bias and not cfg.tie_embeddings and cfg.num_kv_heads == 2
  logits = model(jnp.asarray(ref["input_ids"], jnp.int32))
  assert logits.shape == (2, 24, 512)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(ref["logits"]), atol=1e-4, rtol=0)


def test_greedy_generation_matches_transformers(tiny, ref):
  model, _ = tiny
  prompt = ref["greedy_prompt"][0]
  out = generate(model, [prompt], max_new_tokens=12, temperature=0.0)
  assert prompt + out.tokens[0].tolist() == ref["greedy_output"][0]


@pytest.mark.slow
def test_bfloat16_compute_stays_close(tiny, ref):
  model, _ = load_hf(TINY, dtype="bfloat16")
  assert model.layers[0].mlp.gate_up[...].dtype == jnp.float32
  logits = np.asarray(model(jnp.asarray(ref["input_ids"], jnp.int32)))
  # bfloat16 activations carry ~3 significant digits; logits here are O(1).
  np.testing.assert_allclose(logits, np.asarray(ref["logits"]), atol=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("max_shard_bytes", [None, 200_000])
def test_round_trip_is_exact(tiny, tmp_path, max_shard_bytes):
  model, _ = tiny
  base = json.load(open(os.path.join(TINY, "config.json")))
  save_hf(model, str(tmp_path), base_config=base, max_shard_bytes=max_shard_bytes)
  original = load_file(os.path.join(TINY, "model.safetensors"))
  if max_shard_bytes is None:
    saved = load_file(os.path.join(tmp_path, "model.safetensors"))
  else:
    index = json.load(open(os.path.join(tmp_path, hf.INDEX)))
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1
    saved = {}
    for fname in files:
      saved.update(load_file(os.path.join(tmp_path, fname)))
  assert sorted(saved) == sorted(original)
  for name, arr in original.items():
    assert saved[name].dtype == arr.dtype and np.array_equal(saved[name], arr), name
  again, cfg2 = load_hf(str(tmp_path))
  assert cfg2 == tiny[1]
  assert json.load(open(tmp_path / "config.json"))["architectures"] == ["Qwen2ForCausalLM"]
  ids = jnp.arange(10, dtype=jnp.int32)[None]
  np.testing.assert_array_equal(np.asarray(again(ids)), np.asarray(model(ids)))


@pytest.mark.slow
def test_scanned_layout_loads_and_exports_the_same_checkpoint(tiny, ref, tmp_path):
  """The stacked layout (model.scan_layers) maps to and from the same HF tensors."""
  model, _ = load_hf(TINY, scan_layers=True, remat="full")
  assert model.layers[0].mlp.down[...].shape[0] == tiny[1].num_layers  # one stack
  logits = model(jnp.asarray(ref["input_ids"], jnp.int32))
  np.testing.assert_allclose(np.asarray(logits), np.asarray(ref["logits"]), atol=1e-4, rtol=0)
  save_hf(model, str(tmp_path))
  original = load_file(os.path.join(TINY, "model.safetensors"))
  saved = load_file(os.path.join(tmp_path, "model.safetensors"))
  assert sorted(saved) == sorted(original)
  for name, arr in original.items():
    assert np.array_equal(saved[name], arr), name


def test_lora_on_a_checkpoint_starts_at_the_base(tiny, ref, tmp_path):
  """A checkpoint of the base loads under model.lora with fresh adapters (B = 0): the
  base's logits; the merged export is the base checkpoint again."""
  model, cfg = load_hf(TINY, lora=dict(rank=4, targets=("q", "v", "down")))
  assert cfg.lora.rank == 4
  ids = jnp.asarray(ref["input_ids"], jnp.int32)
  np.testing.assert_array_equal(np.asarray(model(ids)), np.asarray(tiny[0](ids)))
  assert float(jnp.abs(model.layers[0].attn.lora_q.a[...]).max()) > 0
  save_hf(model, str(tmp_path))
  for name, arr in load_file(os.path.join(TINY, "model.safetensors")).items():
    assert np.array_equal(load_file(os.path.join(tmp_path, "model.safetensors"))[name], arr)


def test_bfloat16_checkpoint_loads(tmp_path):
  tensors = load_file(os.path.join(TINY, "model.safetensors"))
  import ml_dtypes
  save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()},
            str(tmp_path / "model.safetensors"))
  shutil.copy(os.path.join(TINY, "config.json"), tmp_path)
  model, _ = load_hf(str(tmp_path), param_dtype="bfloat16")
  got = np.asarray(model.embed[...])
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(got, tensors["model.embed_tokens.weight"].astype(ml_dtypes.bfloat16))


def test_llama_config_and_rope_scaling():
  hf_cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32,
            "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "rope_scaling": {
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "tie_word_embeddings": True, "max_position_embeddings": 131072}
  cfg = from_hf_config(hf_cfg)
  assert not cfg.qkv_bias and cfg.tie_embeddings and cfg.rope_scaling["factor"] == 8.0
  hash(cfg)  # configs are jit static arguments
  from rlcode.models.decoder import rope_frequencies
  inv = np.asarray(rope_frequencies(cfg))
  base = 1.0 / (500000.0 ** (np.arange(0, 4, 2) / 4))
  wavelen = 2 * np.pi / base
  # transformers' _compute_llama3_parameters, by hand for D=4.
  expect = np.where(wavelen > 8192 / 1.0, base / 8.0, base)
  smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
  medium = (wavelen >= 8192 / 4.0) & (wavelen <= 8192 / 1.0)
  expect = np.where(medium, (1 - smooth) * expect / 8.0 + smooth * expect, expect)
  np.testing.assert_allclose(inv, expect, rtol=1e-6)


# --- bad input: each is a clear error naming the file, tensor or limit -----------------

def _copy_tiny(tmp_path):
  for name in ("config.json", "model.safetensors"):
    shutil.copy(os.path.join(TINY, name), tmp_path / name)
  os.chmod(tmp_path / "config.json", 0o644)
  return tmp_path


def test_missing_directory():
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_hf("/nonexistent/checkpoint")


def test_missing_config(tmp_path):
  shutil.copy(os.path.join(TINY, "model.safetensors"), tmp_path)
  with pytest.raises(FileNotFoundError, match="config.json"):
    load_hf(str(tmp_path))


def test_missing_weights(tmp_path):
  shutil.copy(os.path.join(TINY, "config.json"), tmp_path)
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    load_hf(str(tmp_path))


def test_partial_sharded_checkpoint(tiny, tmp_path):
  save_hf(tiny[0], str(tmp_path), base_config=json.load(open(os.path.join(TINY, "config.json"))),
          max_shard_bytes=200_000)
  os.remove(tmp_path / "model-00002-of-00004.safetensors")
  with pytest.raises(FileNotFoundError, match="model-00002-of-00004"):
    load_hf(str(tmp_path))


def test_missing_tensor(tmp_path):
  _copy_tiny(tmp_path)
  tensors = load_file(tmp_path / "model.safetensors")
  del tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, str(tmp_path / "model.safetensors"))
  with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
    load_hf(str(tmp_path))


def test_shape_mismatch_names_tensor_and_file(tmp_path):
  _copy_tiny(tmp_path)
  cfg = json.load(open(tmp_path / "config.json"))
  cfg["intermediate_size"] = 128
  json.dump(cfg, open(tmp_path / "config.json", "w"))
  with pytest.raises(ValueError, match=r"model.safetensors: tensor model.layers.0.mlp.gate_proj"
                                       r".weight has shape \(176, 64\).*\(128, 64\)"):
    load_hf(str(tmp_path))


def test_unexpected_tensor(tmp_path):
  _copy_tiny(tmp_path)
  cfg = json.load(open(tmp_path / "config.json"))
  cfg["num_hidden_layers"] = 1
  del cfg["layer_types"]
  json.dump(cfg, open(tmp_path / "config.json", "w"))
  with pytest.raises(ValueError, match="does not use.*model.layers.1"):
    load_hf(str(tmp_path))


def test_unsupported_architecture(tmp_path):
  _copy_tiny(tmp_path)
  cfg = json.load(open(tmp_path / "config.json"))
  cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
  json.dump(cfg, open(tmp_path / "config.json", "w"))
  with pytest.raises(ValueError, match="GPT2LMHeadModel.*not supported"):
    load_hf(str(tmp_path))


def test_truncated_safetensors(tmp_path):
  _copy_tiny(tmp_path)
  data = open(tmp_path / "model.safetensors", "rb").read()
  open(tmp_path / "model.safetensors", "wb").write(data[:len(data) // 2])
  with pytest.raises(ValueError, match="truncated"):
    load_hf(str(tmp_path))


def test_config_validation():
  with pytest.raises(ValueError, match="num_heads=6 is not a multiple of num_kv_heads=4"):
    ModelConfig(vocab_size=8, hidden_size=24, intermediate_size=8, num_layers=1,
                num_heads=6, num_kv_heads=4)
  with pytest.raises(ValueError, match="dtype='float64'"):
    ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                num_heads=2, num_kv_heads=1, dtype="float64")


def _word_tokenizer(directory, size):
  from tokenizers import Tokenizer, models
  directory.mkdir(parents=True, exist_ok=True)
  Tokenizer(models.WordLevel({f"w{i}": i for i in range(size)}, unk_token="w0")).save(
      str(directory / "tokenizer.json"))
  return str(directory)


def _model_cfg(**values):
  import ml_collections
  arch = dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
              num_kv_heads=1, head_dim=16, max_seq_len=64)
  return ml_collections.ConfigDict({"hf_path": None, "tokenizer": None, "param_dtype": "float32",
                                    "dtype": "float32", "attn_impl": "auto", "arch": arch,
                                    **values})


def test_checkpoint_brings_its_own_tokenizer_unless_one_is_named(tmp_path):
  from rlcode.errors import BadInput
  from rlcode.models.build import build_model
  from rlcode.models.tokenizer import ByteTokenizer
  ckpt = tmp_path / "ckpt"
  shutil.copytree(TINY, ckpt)
  _word_tokenizer(ckpt, 300)  # fits the checkpoint's 512-entry vocabulary
  mesh = sharding.make_mesh(1, 1, 1)
  model, tok = build_model(_model_cfg(hf_path=str(ckpt)), mesh, 0)
  assert isinstance(tok, HFTokenizer) and tok.vocab_size == 300
  _, named = build_model(_model_cfg(hf_path=str(ckpt), tokenizer="bytes"), mesh, 0)
  assert isinstance(named, ByteTokenizer)
  big = _word_tokenizer(tmp_path / "big", 600)
  with pytest.raises(BadInput, match="600 tokens.*512 entries"):
    build_model(_model_cfg(hf_path=str(ckpt), tokenizer=big), mesh, 0)
  with pytest.raises(BadInput, match="600 tokens.*config.model.arch"):
    build_model(_model_cfg(tokenizer=big), mesh, 0)
