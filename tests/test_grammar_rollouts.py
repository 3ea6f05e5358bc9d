"""Rollouts under a grammar: every completion follows it, and the update's recomputed
log-probs are the masked distribution's the engine sampled from (rlcode.rl.rollout with a
grammar, the batches' `allow`, rlcode.rl.logprobs)."""

import json

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
from flax import nnx

import tiny_runs
from rlcode import cli
from rlcode.data.tasks import Task
from rlcode.engine import grammar as grammar_lib
from rlcode.engine.grammar import Grammar
from rlcode.models import Decoder, ModelConfig
from rlcode.models.tokenizer import load_tokenizer
from rlcode.rl import logprobs, packing, rollout, sequences, shared_prefix
from rlcode.train import grpo_loop

TOK = load_tokenizer("bytes")
CFG = ModelConfig(vocab_size=264, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, max_seq_len=256)
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "sure"],
          "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999},
                         "sure": {"type": "boolean"}}}


def test_masked_logprobs_and_entropy_match_numpy():
  rng = np.random.default_rng(0)
  v = 70
  logits = rng.normal(size=(2, 5, v)).astype(np.float32) * 3
  allowed = rng.random((2, 5, v)) < 0.3
  allowed[..., 7] = True
  targets = np.where(allowed[..., 7], 7, 0)
  words = np.zeros((2, 5, grammar_lib.words(v)), np.int64)
  for t in range(v):
    words[..., t // 32] |= allowed[..., t].astype(np.int64) << (t % 32)
  words = words.astype(np.uint32).view(np.int32)
  got, got_h = logprobs.token_logprobs_and_entropy(jnp.asarray(logits), jnp.asarray(targets),
                                                   0.7, jnp.asarray(words))
  z = np.where(allowed, logits / 0.7, -np.inf)
  logz = np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1)) + z.max(-1)
  p = np.exp(z - logz[..., None])
  want = np.take_along_axis(z, targets[..., None], -1)[..., 0] - logz
  want_h = -np.sum(np.where(allowed, p * (np.where(allowed, z, 0.0) - logz[..., None]), 0.0), -1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_h, want_h, rtol=1e-5, atol=1e-5)
  # Chunked (with a padded last chunk) equals unchunked, and is differentiable.
  h = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(8, v)), jnp.float32)
  run = lambda chunk: logprobs.hidden_logprobs(lambda x: x @ w, h, jnp.asarray(targets), 1.0,
                                               chunk, jnp.asarray(words))
  np.testing.assert_allclose(run(2)[0], run(0)[0], rtol=1e-6)
  grad = jax.grad(lambda w_: logprobs.hidden_logprobs(
      lambda x: x @ w_, h, jnp.asarray(targets), 1.0, 2, jnp.asarray(words))[0].sum())(w)
  assert np.isfinite(np.asarray(grad)).all()


@pytest.fixture(scope="module")
def sampled():
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  grammar = Grammar.json_schema(TOK, CFG.vocab_size, SCHEMA)
  tasks = [Task(id=f"t{i}", prompt=f"Task {i}: answer as JSON.") for i in range(3)]
  ro = rollout.sample(model, TOK, tasks, group_size=4, max_new_tokens=40, temperature=1.0,
                      seed=3, grammar=grammar)
  return model, ro


def test_every_finished_rollout_follows_the_grammar(sampled):
  _, ro = sampled
  assert ro.grammar is not None and ro.generation.finished.any()
  for text, finished in zip(ro.texts, ro.generation.finished):
    if finished:
      jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("layout", ["repeated", "shared", "packed"])
def test_recomputed_logprobs_equal_the_masked_behaviour_logprobs(sampled, layout):
  """Each layout's batch carries the masks the tokens were sampled under; its log-probs
  equal the engine's behaviour log-probs (1e-5), and without the masks they do not."""
  model, ro = sampled
  adv = np.zeros(len(ro.texts), np.float32)
  build = {"repeated": sequences.rl_batch, "shared": shared_prefix.rl_batch,
           "packed": lambda *a: packing.rl_batch(*a, pack_tokens=64)}[layout]
  fn = {"repeated": lambda m, b: sequences.sequence_logprobs(m, b, 1.0),
        "shared": shared_prefix.logprob_fn(1.0), "packed": packing.logprob_fn(1.0)}[layout]
  batch = build(ro, adv, TOK.pad_id, 40)
  assert batch.allow is not None and batch.allow.shape[:2] == batch.mask.shape
  got = np.asarray(fn(model, batch)[0])
  m = np.asarray(batch.mask) > 0
  np.testing.assert_allclose(got[m], np.asarray(batch.old_logp)[m], rtol=1e-5, atol=1e-5)
  unmasked = np.asarray(fn(model, batch.__class__(**{**batch.__dict__, "allow": None}))[0])
  assert np.abs(unmasked[m] - np.asarray(batch.old_logp)[m]).max() > 1e-2


@pytest.mark.slow
def test_the_grpo_loop_trains_on_the_masked_distribution(tmp_path):
  """Two tiny GRPO steps under a JSON schema with every row's log-probs recomputed (the
  rollout correction): the trainer's and the sampler's agree (mismatch near 0), where an
  update blind to the masks would see ratios far from 1."""
  path = tmp_path / "answer.json"
  path.write_text(json.dumps(SCHEMA))
  rows = tiny_runs.steps(grpo_loop.train(tiny_runs.config(
      tmp_path / "run", f"--config.rl.grammar={path}", "--config.rl.max_new_tokens=24",
      "--config.rl.rollout_correction=mis")))
  assert len(rows) == 2
  for r in rows:
    assert np.isfinite(r["loss"]) and not r["skipped"]
    assert r["mismatch_kl"] < 1e-5 and abs(r["mismatch_ratio_max"] - 1) < 1e-3
    assert r["mismatch_masked_frac"] == 0


@pytest.mark.parametrize("value, needle", [
    ("answer.txt", "expected a JSON schema (.json) or a Lark grammar (.lark)"),
])
def test_bad_grammar_settings_are_one_line(capsys, value, needle):
  assert cli.main(["config", "show", tiny_runs.CONFIG, f"--config.rl.grammar={value}"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and needle in err, err


def test_a_grammar_file_that_is_not_a_grammar_is_one_line(tmp_path, capsys):
  path = tmp_path / "broken.json"
  path.write_text("{not json")
  code = cli.main(["train", "--config", tiny_runs.CONFIG, *tiny_runs.TINY,
                   f"--config.workdir={tmp_path / 'run'}", f"--config.rl.grammar={path}"])
  err = capsys.readouterr().err
  assert code == 2 and "rl.grammar=" in err and err.count("\n") == 1, err
