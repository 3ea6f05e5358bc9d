"""Attention kinds per layer in the decoder: sliding, document and NSA layers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlcode.kernels import NSAConfig
from rlcode.rl import logprobs
from rlcode.models import Decoder, ModelConfig, save_hf
from rlcode.sampling import generate

BASE = dict(vocab_size=48, hidden_size=32, intermediate_size=48, num_layers=4, num_heads=4,
            num_kv_heads=2, qkv_bias=True, max_seq_len=128)


@functools.partial(jax.jit, static_argnums=0)
def _logits(graphdef, state, tokens, segment_ids=None):
  return nnx.merge(graphdef, state)(tokens, segment_ids=segment_ids)


def _model(**kw):
  return Decoder(ModelConfig(**{**BASE, **kw}), rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_sliding_every_layer_but_every_fourth_matches_the_dense_mask_reference():
  kw = dict(attention_pattern=("sliding", "sliding", "sliding", "dense"), sliding_window=5)
  model = _model(**kw)
  assert model.cfg.layer_kinds == ("sliding", "sliding", "sliding", "dense")
  ref = Decoder(ModelConfig(**{**BASE, **kw, "attn_impl": "reference"}), rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(0), (2, 40), 0, 48)
  got = _logits(*nnx.split(model), tokens)
  want = _logits(*nnx.split(ref), tokens)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)
  dense = _logits(*nnx.split(_model()), tokens)
  assert np.abs(np.asarray(got) - np.asarray(dense)).max() > 1e-3  # the window matters


def _assert_sampled_logprobs_match_full_forward(model, prompts, out, length):
  """Each sample's log-probs equal those of one full forward over prompt + completion."""
  graphdef, state = nnx.split(model)
  for i, completion in enumerate(out.completions()):
    seq = prompts[out.prompt_index[i]] + completion
    logits = _logits(graphdef, state, jnp.asarray([seq + [0] * (length - len(seq))]))[0]
    n = len(prompts[out.prompt_index[i]])
    expect = logprobs.token_logprobs(logits[None, n - 1:len(seq) - 1], jnp.asarray([completion]))
    np.testing.assert_allclose(out.logprobs[i, :len(completion)], np.asarray(expect)[0],
                               atol=2e-5)


@pytest.mark.slow
def test_sliding_generation_decodes_with_the_window():
  model = _model(attention_pattern=("sliding", "dense"), sliding_window=4)
  prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8]]
  out = generate(model, prompts, max_new_tokens=9, temperature=1.0, group_size=2, seed=3)
  _assert_sampled_logprobs_match_full_forward(model, prompts, out, 32)


def test_document_query_does_not_depend_on_document_order():
  model = _model(attention_pattern=("document",))
  graphdef, state = nnx.split(model)
  a, b, query = [5, 6, 7, 8, 9], [11, 12, 13], [20, 21, 22, 23]
  def run(docs):
    tokens = sum(docs, []) + query
    seg = sum([[i] * len(d) for i, d in enumerate(docs)], []) + [len(docs)] * len(query)
    logits = _logits(graphdef, state, jnp.asarray([tokens]), jnp.asarray([seg]))
    return np.asarray(logits)[0, -len(query):]
  np.testing.assert_allclose(run([a, b]), run([b, a]), atol=1e-5)
  # With positions that continue across documents the order shows.
  cont = _model(attention_pattern=("document",), document_positions="continue")
  graphdef, state = nnx.split(cont)
  assert np.abs(run([a, b]) - run([b, a])).max() > 1e-4


NSA = NSAConfig(block_cmp=8, stride_cmp=4, block_sel=8, num_sel=3, num_local=1, window=8,
                compress_hidden=16)


@pytest.mark.slow
def test_nsa_layers_train():
  model = _model(attention_pattern=("nsa", "dense"), nsa=NSA)
  graphdef, params = nnx.split(model, nnx.Param)
  tokens = jax.random.randint(jax.random.key(1), (2, 40), 0, 48)
  loss = lambda p: logprobs.cross_entropy(nnx.merge(graphdef, p)(tokens[:, :-1]), tokens[:, 1:])
  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  assert np.isfinite(float(value))
  assert float(jnp.abs(grads["layers"][0]["attn"]["gate"][...]).max()) > 0


@pytest.mark.slow
def test_nsa_generation_decodes_as_the_full_forward():
  # Prompts of 3 and 13 tokens, 30 new: decoding crosses compressed-token
  # boundaries (every 4 tokens from 8 on), selection blocks (every 8) and the
  # window (8), so the cache updates of every branch are exercised.
  model = _model(attention_pattern=("nsa", "dense", "nsa"), nsa=NSA, num_layers=3)
  prompts = [[1, 2, 3], list(range(5, 18))]
  out = generate(model, prompts, max_new_tokens=30, temperature=1.0, group_size=2, seed=4)
  _assert_sampled_logprobs_match_full_forward(model, prompts, out, 48)
  with pytest.raises(ValueError, match="offload_kv is not implemented"):
    generate(model, [[1, 2, 3]], max_new_tokens=2, offload_kv=True)


def test_bad_layer_configs(tmp_path):
  with pytest.raises(ValueError, match="kinds must be from"):
    ModelConfig(**BASE, attention_pattern=("local",))
  with pytest.raises(ValueError, match="sliding_window must be >= 1"):
    ModelConfig(**BASE, attention_pattern=("sliding",))
  with pytest.raises(ValueError, match="nsa must be set"):
    ModelConfig(**BASE, attention_pattern=("nsa",))
  with pytest.raises(ValueError, match="no Hugging Face equivalent"):
    save_hf(_model(attention_pattern=("document",)), str(tmp_path))
