"""Every family the loader accepts against transformers' own outputs, and back out again.

The checkpoints under tests/data/hf are tiny random transformers models (every parameter
drawn, norms and routers included) with transformers' float32 logits and greedy tokens
(tests/data/hf/make_refs.py, run with torch). Here: logits within 1e-4 and 12 greedy tokens
equal for each family (the static sampler's and the engine's), float32 checkpoints and a bfloat16 one, single and sharded
safetensors, tied and untied embeddings; export writes the same tensors back.
"""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from rlcode.engine import Engine, Request
from rlcode.errors import BadInput
from rlcode.models import hf, load_hf, save_hf
from rlcode.models.hf_config import FAMILIES, from_hf_config
from rlcode.sampling import generate

HERE = os.path.join(os.path.dirname(__file__), "data", "hf")
# Each case is a directory; Python's bytecode cache (made when make_refs.py is imported) is not.
CASES = sorted(d for d in os.listdir(HERE)
               if os.path.isdir(os.path.join(HERE, d)) and d != "__pycache__")


def _refs(case):
  with open(os.path.join(HERE, case, "refs.json")) as f:
    return json.load(f)


def test_every_family_has_a_case():
  families = {json.load(open(os.path.join(HERE, c, "config.json")))["model_type"]
              for c in CASES}
  assert set(FAMILIES) - {"qwen2", "llama"} <= families


@pytest.mark.parametrize("case", CASES)
def test_logits_and_greedy_tokens_match_transformers(case):
  refs = _refs(case)
  model, cfg = load_hf(os.path.join(HERE, case), param_dtype="float32", dtype="float32")
  logits = np.asarray(model(jnp.asarray(refs["input_ids"], jnp.int32)))
  want = np.asarray(refs["logits"], np.float32)
  assert logits.shape == want.shape
  np.testing.assert_allclose(logits, want, atol=1e-4, rtol=0)
  prompt = refs["greedy_prompt"][0]
  out = generate(model, [prompt], max_new_tokens=12, temperature=0.0)
  assert prompt + out.tokens[0].tolist() == refs["greedy_output"][0]
  # The engine, on pages smaller than the prompt (several pages, the last one partial).
  engine = Engine(model, num_pages=16, page_size=4, max_rows=4)
  got = engine.generate([Request(prompt, 12, temperature=0.0)])[0].candidates[0].tokens
  assert prompt + got == refs["greedy_output"][0]


def test_the_cases_cover_the_storage_variants():
  configs = {c: json.load(open(os.path.join(HERE, c, "config.json"))) for c in CASES}
  assert {c.get("tie_word_embeddings") for c in configs.values()} == {True, False}
  assert any(c["dtype"] == "bfloat16" for c in configs.values())
  assert any(os.path.isfile(os.path.join(HERE, c, hf.INDEX)) for c in CASES)


def test_a_bfloat16_checkpoint_keeps_its_dtype_unless_told():
  model, cfg = load_hf(os.path.join(HERE, "qwen3_yarn_bf16"))
  assert cfg.param_dtype == "bfloat16"
  assert model.embed[...].dtype == jnp.bfloat16


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_export_writes_the_checkpoint_back(case, tmp_path):
  """save_hf of a loaded model: the same tensor names, dtypes and values, a config that
  loads to the same ModelConfig (scanned layout too), and that transformers loads to the
  reference logits."""
  src = os.path.join(HERE, case)
  model, cfg = load_hf(src)
  save_hf(model, str(tmp_path), base_config=json.load(open(os.path.join(src, "config.json"))))
  original = {}
  for fname in sorted({f for f in hf._weight_files(src).values()}):
    original.update(load_file(fname))
  saved = load_file(os.path.join(tmp_path, hf.SINGLE))
  assert sorted(saved) == sorted(original)
  for name, arr in original.items():
    assert saved[name].dtype == arr.dtype and np.array_equal(saved[name], arr), name
  again, cfg2 = load_hf(str(tmp_path))
  assert cfg2 == cfg
  import torch  # the dev extra
  import transformers
  theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
  with torch.no_grad():
    logits = theirs(torch.tensor(_refs(case)["input_ids"])).logits.numpy()
  np.testing.assert_allclose(logits, np.asarray(_refs(case)["logits"]), atol=1e-5, rtol=0)
  f32 = dict(param_dtype="float32", dtype="float32")
  scanned, _ = load_hf(str(tmp_path), scan_layers=True, **f32)
  looped, _ = load_hf(src, **f32)
  ids = jnp.asarray(_refs(case)["input_ids"], jnp.int32)
  np.testing.assert_allclose(np.asarray(scanned(ids)), np.asarray(looped(ids)), atol=1e-5,
                             rtol=0)


@pytest.mark.parametrize("field, value, words", [
    ("hidden_act", "relu", "hidden_act"),
    ("final_logit_softcapping", 30.0, "final_logit_softcapping"),
    ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}, "dynamic"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4}, "factor"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1e4,
                         "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("layer_types", ["full_attention", "chunked_attention", "full_attention"], "layer_types"),
])
def test_unsupported_fields_are_one_line(field, value, words):
  config = json.load(open(os.path.join(HERE, "qwen3", "config.json")))
  config[field] = value
  with pytest.raises(BadInput, match=words):
    from_hf_config(config)


def test_unsupported_families_say_what_is_missing():
  with pytest.raises(BadInput, match="latent attention"):
    from_hf_config({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"})
  with pytest.raises(BadInput, match="Gemma3ForCausalLM"):
    from_hf_config({"architectures": ["Phi4MMForCausalLM"], "model_type": "phi4mm"})


def test_older_config_layouts_translate_the_same():
  """Checkpoints written before transformers 5: rope_scaling / rope_theta, Gemma 3's
  rope_local_base_freq and sliding_window_pattern, Qwen's use_sliding_window."""
  new = json.load(open(os.path.join(HERE, "gemma3", "config.json")))
  old = {k: v for k, v in new.items() if k not in ("rope_parameters", "layer_types")}
  old.update(rope_theta=1e6, rope_scaling={"rope_type": "linear", "factor": 4.0},
             rope_local_base_freq=1e4, sliding_window_pattern=2)
  assert from_hf_config(old) == from_hf_config(new)
  new = json.load(open(os.path.join(HERE, "qwen2_sliding", "config.json")))
  old = {k: v for k, v in new.items() if k not in ("rope_parameters", "layer_types")}
  old.update(rope_theta=1e4)
  assert from_hf_config(old) == from_hf_config(new)
