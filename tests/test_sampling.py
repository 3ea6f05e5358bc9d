"""The compiled sampler: KV-cache decoding equals full forwards, ragged batches, stopping."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlcode.engine import programs
from rlcode.rl import logprobs
from rlcode import sampling
from rlcode.sampling import engines, generation
from rlcode.models import Decoder, ModelConfig
from rlcode.sampling import generate, sample_logits, static_generate

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, qkv_bias=True, max_seq_len=96)


@pytest.fixture(scope="module")
def model():
  return Decoder(CFG, rngs=nnx.Rngs(0))


PROMPTS = [[3, 4, 5], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11], [1], [20, 21, 22, 23, 24]]


PAD_TO = 32


def _full_logits(model, seq):
  """Logits of one sequence from a plain forward, padded right to one jitted shape
  (right padding cannot change causal logits at earlier positions)."""
  graphdef, state = nnx.split(model)
  padded = jnp.zeros((1, PAD_TO), jnp.int32).at[0, :len(seq)].set(jnp.asarray(seq))
  return _forward(graphdef, state, padded)[0, :len(seq)]


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens):
  return nnx.merge(graphdef, state)(tokens)


def _teacher_forced_logprobs(model, prompt, completion, temperature):
  seq = prompt + completion
  logits = _full_logits(model, seq)[None, len(prompt) - 1:-1]
  targets = jnp.asarray([completion], jnp.int32)
  return np.asarray(logprobs.token_logprobs(logits, targets, temperature))[0]


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_full_forward(model, temperature):
  out = generate(model, PROMPTS, max_new_tokens=12, temperature=temperature, group_size=2,
                 seed=5)
  assert out.tokens.shape == (8, 12)
  for i, completion in enumerate(out.completions()):
    prompt = PROMPTS[out.prompt_index[i]]
    expect = _teacher_forced_logprobs(model, prompt, completion, temperature)
    np.testing.assert_allclose(out.logprobs[i, :len(completion)], expect, atol=2e-5)


@pytest.mark.slow
def test_greedy_equals_argmax_of_full_forward(model):
  out = generate(model, PROMPTS, max_new_tokens=10, temperature=0.0)
  for i, prompt in enumerate(PROMPTS):
    seq = list(prompt)
    for _ in range(10):
      seq.append(int(jnp.argmax(_full_logits(model, seq)[-1])))
    assert out.tokens[i].tolist() == seq[len(prompt):]


@pytest.mark.slow
def test_rows_do_not_depend_on_the_rest_of_the_batch(model):
  together = generate(model, PROMPTS, max_new_tokens=8, temperature=1.0, group_size=3, seed=2)
  alone = generate(model, PROMPTS[1:2], max_new_tokens=8, temperature=1.0, group_size=3, seed=2)
  # Row keys are (seed, step, row); prompt 1 alone has rows 0..2, in the batch 3..5.
  assert not np.array_equal(together.tokens[3:6], alone.tokens)
  shifted = generate(model, PROMPTS[:2], max_new_tokens=8, temperature=1.0, group_size=3, seed=2)
  np.testing.assert_array_equal(together.tokens[:6], shifted.tokens)
  np.testing.assert_allclose(together.logprobs[:6], shifted.logprobs, atol=1e-6)


def test_each_row_stops_at_its_own_stop_token(model):
  free = generate(model, PROMPTS, max_new_tokens=12, temperature=1.0, group_size=2, seed=9)
  stop = int(free.tokens[0, 3])  # a token row 0 emits at step 3 (maybe earlier too)
  out = generate(model, PROMPTS, max_new_tokens=12, temperature=1.0, group_size=2, seed=9,
                 stop_tokens=[stop], pad_id=63)
  for i in range(len(out.tokens)):
    row = free.tokens[i].tolist()
    n = row.index(stop) + 1 if stop in row else 12
    assert out.lengths[i] == n and out.finished[i] == (stop in row)
    assert out.tokens[i, :n].tolist() == row[:n]
    assert np.all(out.tokens[i, n:] == 63) and np.all(out.logprobs[i, n:] == 0)
  assert out.lengths[0] <= 4


def test_group_samples_differ_and_share_the_prompt(model):
  out = generate(model, [[1, 2, 3]], max_new_tokens=16, temperature=1.0, group_size=4, seed=0)
  assert out.prompt_index.tolist() == [0, 0, 0, 0]
  assert len({tuple(r) for r in out.tokens.tolist()}) == 4


def test_prompt_lengths_share_compiled_shapes(model):
  before = sampling.decode._cache_size()
  for n in (2, 5, 9, 16):  # all in the 16-token bucket
    generate(model, [list(range(1, n + 1))], max_new_tokens=4, temperature=0.0)
  assert sampling.decode._cache_size() - before <= 1


def test_a_runs_longest_prompt_gives_its_batches_one_engine_pool(model, monkeypatch):
  """With min_prompt_len (a run's longest prompt), batches of other prompt lengths get
  the same engine pool (the shape every engine program is compiled for, so they reuse
  the programs); without it, each batch's pool fits its own prompts. The tokens do not
  depend on it."""
  pools = []
  zero_pools = programs.zero_pools
  monkeypatch.setattr(programs, "zero_pools",
                      lambda cfg, pages, *a, **k: pools.append(pages) or zero_pools(
                          cfg, pages, *a, **k))
  kw = dict(max_new_tokens=8, temperature=1.0, group_size=4, seed=3, page_size=4)
  batches = [[PROMPTS[0], PROMPTS[1]], [PROMPTS[2], PROMPTS[3]]]  # longest: 11 tokens
  sized = [generate(model, b, min_prompt_len=11, **kw) for b in batches]
  plain = [generate(model, b, **kw) for b in batches]
  assert pools[0] == pools[1] and pools[2] != pools[3], pools
  for got, want in zip(sized, plain):
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.logprobs, want.logprobs)


def test_a_shared_pool_lets_two_kinds_of_batch_share_compiled_programs(model, monkeypatch):
  """A run's rollouts (few prompts, many samples) and evaluations (more prompts, fewer
  samples) on `engines.shared_pool` get one pool, the larger of their own: the decode
  programs the first kind compiled serve the second's row counts, and the tokens are
  those of each batch's own pool."""
  pools = []
  zero_pools = programs.zero_pools
  monkeypatch.setattr(programs, "zero_pools",
                      lambda cfg, pages, *a, **k: pools.append(pages) or zero_pools(
                          cfg, pages, *a, **k))
  rollouts = dict(prompts=[PROMPTS[0], PROMPTS[1]], group_size=8)
  evals = dict(prompts=PROMPTS[:4], group_size=4)
  longest = max(len(p) for p in PROMPTS[:4])
  pool = engines.shared_pool([(2, longest, 8, 8), (4, longest, 4, 8)], None, page_size=4)
  own = [engines.pool_pages(engines.pages_needed([longest] * 2, 8, 8, 4)),
         engines.pool_pages(engines.pages_needed([longest] * 4, 4, 8, 4))]
  assert pool == max(own) and own[0] != own[1]
  kw = dict(max_new_tokens=8, temperature=1.0, seed=5, page_size=4, min_prompt_len=longest)
  decode = programs.for_graph(nnx.graphdef(model)).decode
  first = generate(model, rollouts["prompts"], group_size=8, num_pages=pool, **kw)
  compiled = decode._cache_size()
  second = generate(model, evals["prompts"], group_size=4, num_pages=pool, **kw)
  assert pools == [pool, pool]
  # 16 rows each: the evaluation's programs are the rollouts' (with their own pools, the
  # evaluation compiled its own).
  assert decode._cache_size() == compiled
  for got, batch in ((first, rollouts), (second, evals)):
    want = generate(model, batch["prompts"], group_size=batch["group_size"], **kw)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.logprobs, want.logprobs)


def test_top_k_one_and_tiny_top_p_are_greedy():
  logits = jax.random.normal(jax.random.key(0), (6, 50))
  keys = jax.random.split(jax.random.key(1), 6)
  greedy, _ = sample_logits(logits, keys, temperature=0.0)
  k1, lp_k1 = sample_logits(logits, keys, temperature=1.0, top_k=1)
  p0, lp_p0 = sample_logits(logits, keys, temperature=1.0, top_p=1e-6)
  np.testing.assert_array_equal(k1, greedy)
  np.testing.assert_array_equal(p0, greedy)
  np.testing.assert_allclose(lp_k1, 0.0, atol=1e-6)  # one token carries all the mass


def test_top_p_keeps_the_nucleus():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  keys = jax.random.split(jax.random.key(0), 2000)
  toks, lps = jax.vmap(lambda k: sample_logits(logits, k[None], temperature=1.0, top_p=0.7))(keys)
  counts = np.bincount(np.asarray(toks).ravel(), minlength=4) / 2000
  # mass 0.5 + 0.3 reaches 0.7: tokens 2 and 3 are cut, the rest renormalised.
  assert counts[2] == counts[3] == 0
  assert abs(counts[0] - 0.625) < 0.04
  np.testing.assert_allclose(np.exp(np.asarray(lps)).ravel()[np.asarray(toks).ravel() == 0], 0.625,
                             atol=1e-5)


def test_bad_input(model):
  with pytest.raises(ValueError, match="prompt 1 has 90 tokens.*context of 96"):
    generate(model, [[1], list(range(90))], max_new_tokens=8)
  with pytest.raises(ValueError, match="prompt 0 is empty"):
    generate(model, [[]], max_new_tokens=8)
  with pytest.raises(ValueError, match="group_size=0"):
    generate(model, [[1]], max_new_tokens=8, group_size=0)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prompt_sampler_equals_unshared(model, temperature):
  kwargs = dict(max_new_tokens=10, temperature=temperature, group_size=3, seed=4,
                stop_tokens=[7])
  shared = static_generate(model, PROMPTS, share_prompt=True, **kwargs)
  private = static_generate(model, PROMPTS, share_prompt=False, **kwargs)
  np.testing.assert_array_equal(shared.tokens, private.tokens)
  np.testing.assert_array_equal(shared.lengths, private.lengths)
  np.testing.assert_allclose(shared.logprobs, private.logprobs, atol=1e-5)


@pytest.mark.slow
def test_host_offloaded_prompt_kv_gives_the_same_samples(model):
  kwargs = dict(max_new_tokens=10, temperature=1.0, group_size=2, seed=6, stop_tokens=[7])
  device = static_generate(model, PROMPTS, **kwargs)
  host = generate(model, PROMPTS, offload_kv=True, **kwargs)  # the static loop's
  np.testing.assert_array_equal(host.tokens, device.tokens)
  np.testing.assert_allclose(host.logprobs, device.logprobs, atol=1e-6)
  # The prefill leaves the prompts' KV in pinned host memory, where decoding reads it.
  graphdef, state = nnx.split(model)
  prefill = generation._prefill_fn(None, model.cfg.num_layers, True)
  _, prefix, _ = prefill(state, jnp.zeros((4, 16), jnp.int32), jnp.ones((4,), jnp.int32),
                         graphdef=graphdef, group_size=2, max_new_tokens=4, mesh=None,
                         share_prompt=True, offload_kv=True)
  assert prefix.on_host
  assert {x.sharding.memory_kind for x in prefix.k + prefix.v} == {"pinned_host"}
