"""On-policy distillation: the teacher's per-token reward against numpy full forwards of two
independent models, the per-token advantage in the objective, the teacher's loading and
its checks, and a tiny GRPO run with a teacher saved the way the trainer saves."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import tiny_hf
import tiny_runs
from rlcode import cli
from rlcode.config import record
from rlcode.errors import BadInput
from rlcode.models import Decoder, ModelConfig
from rlcode.models.build import build_model
from rlcode.models.hf import load_hf
from rlcode.parallel import sharding
from rlcode.policy import teacher as teacher_lib
from rlcode.rl import distill, objective, sequences, shared_prefix
from rlcode.runs import checkpoint
from rlcode.sampling import generate
from rlcode.train import grpo_loop

CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=16, max_seq_len=64, attn_impl="reference")
GRPO = os.path.join(tiny_runs.ROOT, "configs", "grpo_tiny.py")


def _full_logprobs(model, prompt, completion, temperature):
  """numpy log p(completion[t] | prompt, completion[:t]) of one full forward over
  prompt + completion, at `temperature`."""
  tokens = np.array([list(prompt) + list(completion)], np.int32)
  logits = np.asarray(jax.jit(model)(jnp.asarray(tokens)), np.float64)[0] / temperature
  logits -= logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  start = len(prompt) - 1
  return np.array([logp[start + t, c] for t, c in enumerate(completion)])


@pytest.mark.parametrize("layout", ["sequences", "shared_prefix"])
def test_reward_is_the_teachers_minus_the_students_logprob(layout):
  """A student samples (the engine's behaviour log-probs); the teacher's batched forward in
  the batch's layout gives r_t = log p_teacher - log p_student on every sampled token, equal
  to the difference of numpy log-softmaxes of two independent full forwards of the two
  models; the advantages are A + coef * r_t (and coef * r_t alone with `only`)."""
  mesh = sharding.make_mesh(1, 1, 1)
  temperature = 0.8
  student = Decoder(CFG, rngs=nnx.Rngs(1))
  teacher = Decoder(CFG, rngs=nnx.Rngs(2))
  prompts = [[1, 5, 7], [2, 9, 4, 11, 3, 6]]
  g = 3
  gen = generate(student, prompts, max_new_tokens=6, temperature=temperature, group_size=g,
                 stop_tokens=(0,), seed=3, pad_id=0, mesh=mesh)
  completions = gen.completions()
  adv = np.array([1.0, -0.5, 0.25, 0.0, 2.0, -1.0], np.float32)
  if layout == "sequences":
    batch = sequences.sequence_batch(prompts, completions, gen.prompt_index, pad_id=0,
                                     old_logp=gen.logprobs, adv=adv, multiple=8)
    logprob_fn = None
  else:
    batch = shared_prefix.grouped_batch(prompts, completions, pad_id=0, completion_len=8,
                                        old_logp=gen.logprobs, adv=adv, prompt_multiple=8)
    logprob_fn = shared_prefix.logprob_fn(temperature)
  graphdef, params = nnx.split(teacher, nnx.Param)
  d = distill.Distill(coef=0.5)
  fn = distill.Teacher(graphdef, params, mesh, temperature, len(completions), d, logprob_fn)
  got_adv, reward, metrics = jax.device_get(fn(batch))

  want = np.zeros_like(batch.mask)
  for i, c in enumerate(completions):
    p = prompts[gen.prompt_index[i]]
    want[i, :len(c)] = (_full_logprobs(teacher, p, c, temperature)
                        - _full_logprobs(student, p, c, temperature))
  assert (batch.mask.sum(1) == [len(c) for c in completions]).all()
  np.testing.assert_allclose(reward, want, atol=2e-5)
  assert np.abs(want).max() > 0.1  # two different models: the reward is not ~0
  np.testing.assert_allclose(got_adv, adv[:, None] + 0.5 * want, atol=2e-5)
  trained = batch.mask > 0
  np.testing.assert_allclose(metrics["distill_reverse_kl"], -want[trained].mean(), atol=2e-5)
  only = distill.Teacher(graphdef, params, mesh, temperature, len(completions),
                         distill.Distill(coef=2.0, only=True), logprob_fn)
  np.testing.assert_allclose(jax.device_get(only(batch))[0], 2.0 * want, atol=4e-5)


@pytest.mark.parametrize("name", sorted(objective.OBJECTIVES))
def test_a_per_token_advantage_equal_along_a_row_is_the_rows(name):
  """Every objective reads an advantage per token [N, W]; one equal along each row gives
  the loss and gradient of the row's advantage [N]."""
  rng = np.random.default_rng(0)
  logp, old = rng.normal(-1, 0.3, (2, 3, 5)).astype(np.float32)
  mask = (rng.random((3, 5)) > 0.3).astype(np.float32)
  adv = np.array([1.0, -2.0, 0.5], np.float32)
  cfg = objective.LossConfig(objective=name)
  loss = lambda lp, a: objective.policy_loss(lp, old, a, mask, cfg)[0]
  row = jax.value_and_grad(loss)(logp, adv)
  tok = jax.value_and_grad(loss)(logp, np.repeat(adv[:, None], 5, 1))
  np.testing.assert_allclose(tok[0], row[0], rtol=1e-6)
  np.testing.assert_allclose(tok[1], row[1], rtol=1e-6, atol=1e-7)
  # A token's own advantage moves only that token's gradient under ppo and cispo.
  if name in ("ppo", "cispo"):
    bumped = np.repeat(adv[:, None], 5, 1)
    bumped[1, 2] += 1.0
    grad = jax.grad(loss)(logp, bumped)
    moved = np.abs(grad - row[1]) > 1e-7
    assert moved[1, 2] == (mask[1, 2] > 0) and moved.sum() == int(mask[1, 2] > 0)


def _save_teacher(workdir, seed, *overrides):
  """A tiny random policy saved as a run's warm start is: its config (config.json) and its
  parameters alone at step 0 (checkpoint.save_once, which the trainer's Run.save_once
  calls)."""
  config = tiny_runs.config(workdir, f"--config.seed={seed}", *overrides)
  model, _ = build_model(config.model, sharding.mesh_from_config(config.mesh), seed)
  _, params = nnx.split(model, nnx.Param)
  record.write_run_config(config, workdir)
  checkpoint.save_once(os.path.join(workdir, checkpoint.WARM_START), 0, params, {"step": 0})
  return os.path.join(workdir, checkpoint.WARM_START), params


def _load_teacher(config, mesh, tokenizer):
  return teacher_lib.load(config.rl.distill_teacher, config.model, mesh, tokenizer, config.seed)


def test_teacher_is_loaded_on_the_mesh_and_must_share_the_tokenizer(tmp_path):
  path, params = _save_teacher(str(tmp_path / "teacher"), 7)
  config = tiny_runs.config(str(tmp_path / "student"), f"--config.rl.distill_teacher={path}")
  mesh = sharding.mesh_from_config(config.mesh)
  _, tokenizer = build_model(config.model, mesh, 0)
  graphdef, loaded = _load_teacher(config, mesh, tokenizer)
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert _load_teacher(tiny_runs.config(str(tmp_path / "s2")), mesh, tokenizer) is None
  other, _ = _save_teacher(str(tmp_path / "other"), 7, "--config.model.tokenizer=bytes+tools")
  config = tiny_runs.config(str(tmp_path / "s3"), f"--config.rl.distill_teacher={other}")
  with pytest.raises(BadInput, match="does not share the student's tokenizer"):
    _load_teacher(config, mesh, tokenizer)


def test_a_hugging_face_teacher_is_built_with_the_students_model_section(tmp_path):
  """A Hugging Face directory as the teacher: loaded with its own tokenizer, which a student
  on that checkpoint shares and a byte-level student does not."""
  base = tiny_hf.checkpoint("qwen3", tmp_path)
  config = tiny_runs.config(str(tmp_path / "s"), f"--config.model.hf_path={base}",
                            f"--config.rl.distill_teacher={base}")
  mesh = sharding.mesh_from_config(config.mesh)
  _, tokenizer = build_model(config.model, mesh, 0)
  _, params = _load_teacher(config, mesh, tokenizer)
  want, _ = load_hf(base, mesh=mesh)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(nnx.split(want, nnx.Param)[1])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  config = tiny_runs.config(str(tmp_path / "b"), f"--config.rl.distill_teacher={base}")
  _, tokenizer = build_model(config.model, mesh, 0)
  with pytest.raises(BadInput, match="vocab_size"):
    _load_teacher(config, mesh, tokenizer)


@pytest.mark.parametrize("flags, needle", [
    (["--config.rl.distill_only=true"], "rl.distill_only=true needs a teacher"),
    (["--config.rl.distill_coef=-1"], "config.rl.distill_coef=-1"),
    (["--config.rl.distill_teacher=t", "--config.rl.distill_only=true",
      "--config.rl.sample_rounds=2"], "rl.sample_rounds=2 keeps groups by their task"),
])
def test_bad_distillation_settings_are_one_line(capsys, flags, needle):
  assert cli.main(["config", "show", GRPO, *flags]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and needle in err, err


@pytest.mark.slow
def test_a_tiny_grpo_run_with_a_teacher(tmp_path):
  """Two tiny GRPO steps whose teacher is the student's own initial policy, saved as a run's
  warm start is: at step 1 the teacher's batched forward equals the sampler's log-probs
  (reverse KL ~0); at step 2 the student has moved away from it (positive); the update
  is finite."""
  seed = tiny_runs.config(str(tmp_path / "x")).seed
  path, _ = _save_teacher(str(tmp_path / "teacher"), seed)
  rows = tiny_runs.steps(grpo_loop.train(tiny_runs.config(
      str(tmp_path / "student"), f"--config.rl.distill_teacher={path}",
      "--config.rl.distill_coef=0.5")))
  assert len(rows) == 2
  for r in rows:
    assert np.isfinite(r["loss"]) and not r["skipped"] and r["grad_norm"] > 0
    assert r["distill_teacher_logp"] < 0
  assert abs(rows[0]["distill_reverse_kl"]) < 1e-4 < rows[1]["distill_reverse_kl"]
