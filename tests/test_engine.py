"""The inference engine: the static sampler's tokens, whatever the page size, the batch or
the arrival order; behaviour log-probs equal to the update's; prefix-cache hits, preemption
and weight swaps that change nothing they should not."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlcode.engine import Engine, PagePool, Request, pages, programs
from rlcode.models import Decoder, ModelConfig
from rlcode.rl import logprobs
from rlcode.sampling import static_generate

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, qkv_bias=True, max_seq_len=96)
PROMPTS = [[3, 4, 5], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11], [1], [20, 21, 22, 23, 24]]
G = 3


@pytest.fixture(scope="module")
def model():
  return Decoder(CFG, rngs=nnx.Rngs(0))


def _requests(prompts=PROMPTS, *, max_tokens=12, seed=5, **sampling):
  return [Request(p, max_tokens, n=G, seed=seed, rows=[G * i + g for g in range(G)],
                  **sampling) for i, p in enumerate(prompts)]


def _tokens(results):
  return [c.tokens for r in results for c in r.candidates]


def _logprobs(results):
  return [c.logprobs for r in results for c in r.candidates]


@pytest.mark.parametrize("sampling, page_size", [
    (dict(temperature=0.0), 4), (dict(temperature=0.8, top_p=0.9, top_k=20), 16)])
def test_tokens_equal_the_static_samplers(model, sampling, page_size):
  want = static_generate(model, PROMPTS, max_new_tokens=12, group_size=G, seed=5, **sampling)
  engine = Engine(model, num_pages=64, page_size=page_size, max_rows=16)
  results = engine.generate(_requests(**sampling))
  assert _tokens(results) == want.completions()
  for got, row in zip(_logprobs(results), want.logprobs):
    np.testing.assert_allclose(got, row[:len(got)], atol=1e-5, rtol=0)


def test_samples_do_not_depend_on_page_size_batch_or_arrival(model):
  # A 40-token prompt: ten full pages of 4 (its candidates share them all), and three
  # chunks of prefill at 16 tokens a step.
  prompts = PROMPTS + [[(7 * i) % 60 + 1 for i in range(40)]]
  want = _tokens(Engine(model, num_pages=64, page_size=16, max_rows=16)
                 .generate(_requests(prompts, temperature=1.0)))
  # Four rows at most, pages of 4, the requests in reverse order and arriving while
  # others decode.
  engine = Engine(model, num_pages=64, page_size=4, max_rows=4, prefill_tokens=16)
  requests = _requests(prompts, temperature=1.0)
  done, busiest = {}, 0

  def step():
    nonlocal busiest
    engine.step()
    busiest = max(busiest, engine.busy_rows(), len(engine.decoding))

  for i in reversed(range(len(requests))):
    requests[i].on_done = functools.partial(done.__setitem__, i)
    engine.submit(requests[i])
    for _ in range(3):
      step()
  while not engine.idle():
    step()
  assert _tokens([done[i] for i in range(len(requests))]) == want
  assert busiest <= 4
  assert engine.pool.available() == engine.pool.num_pages - 1  # every page back


def test_a_failing_stop_check_ends_its_own_request_only(model):
  def broken(c, tokens):
    raise RuntimeError("a broken stop check")

  engine = Engine(model, num_pages=64, page_size=4, max_rows=8)
  done = {}
  for name, check in (("broken", broken), ("fine", None)):
    engine.submit(Request([3, 4, 5], 6, n=2, temperature=1.0, stop_check=check,
                          on_done=functools.partial(done.__setitem__, name)))
  while not engine.idle():
    engine.step()
  assert isinstance(done["broken"].error, RuntimeError)
  assert [c.finish_reason for c in done["broken"].candidates] == ["error", "error"]
  assert done["fine"].error is None
  assert [len(c.tokens) for c in done["fine"].candidates] == [6, 6]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_the_updates_recomputation(model, temperature):
  results = Engine(model, num_pages=64, page_size=4, max_rows=16).generate(
      _requests(temperature=temperature))
  graphdef, state = nnx.split(model)
  forward = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))
  for r, prompt in zip(results, PROMPTS):
    for cand in r.candidates:
      seq = np.zeros((1, 32), np.int32)
      seq[0, :len(prompt) + len(cand.tokens)] = prompt + cand.tokens
      logits = forward(state, jnp.asarray(seq))[:, len(prompt) - 1:len(prompt) - 1 + len(cand.tokens)]
      want = logprobs.token_logprobs(logits, jnp.asarray([cand.tokens]), temperature)[0]
      np.testing.assert_allclose(cand.logprobs, np.asarray(want), atol=1e-5, rtol=0)
      assert cand.versions == [0] * len(cand.tokens)


def test_a_prefix_cache_hit_gives_what_a_miss_gives(model):
  system = list(range(30, 50))  # 20 tokens: five full pages of 4
  prompts = [system + [3, 4], system + [5, 6, 7]]
  cold = Engine(model, num_pages=64, page_size=4, max_rows=8, prefix_cache=False)
  want = [_tokens(cold.generate(_requests([p], temperature=1.0))) for p in prompts]
  warm = Engine(model, num_pages=64, page_size=4, max_rows=8)
  first = warm.generate(_requests(prompts[:1], temperature=1.0))
  second = warm.generate(_requests(prompts[1:], temperature=1.0))
  assert first[0].cached_tokens == 0 and second[0].cached_tokens == 20
  assert [_tokens(first), _tokens(second)] == want


def test_preemption_with_recompute_gives_what_no_preemption_gives(model):
  requests = lambda: _requests(PROMPTS[:2], max_tokens=20, temperature=1.0)
  want = _tokens(Engine(model, num_pages=64, page_size=4, max_rows=16).generate(requests()))
  # 10 pages of 4 hold one row's 31 positions but not six rows'.
  small = Engine(model, num_pages=11, page_size=4, max_rows=16)
  results = small.generate(requests())
  assert small.stats["preemptions"] > 0
  assert _tokens(results) == want
  assert small.pool.used() == 0


def _recomputed(models, temperature, prompt, cand):
  """Each token's log-probability under a forward of its version's weights over the
  prompt and the tokens before it (one causal forward of the whole row a version, padded
  to one shape)."""
  seq = np.zeros((1, 32), np.int32)
  seq[0, :len(prompt) + len(cand.tokens)] = prompt + cand.tokens
  span = slice(len(prompt) - 1, len(prompt) - 1 + len(cand.tokens))
  by_version = {}
  for version, m in models.items():
    graphdef, state = nnx.split(m)
    logits = _forward(graphdef)(state, jnp.asarray(seq))[:, span]
    by_version[version] = np.asarray(
        logprobs.token_logprobs(logits, jnp.asarray([cand.tokens]), temperature))[0]
  return [float(by_version[v][i]) for i, v in enumerate(cand.versions)]


@functools.lru_cache(maxsize=None)
def _forward(graphdef):
  return jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))


def test_published_weights_take_effect_between_steps(model):
  other = Decoder(CFG, rngs=nnx.Rngs(1)).for_sampling()
  engine = Engine(model, num_pages=64, page_size=4, max_rows=4)
  done = []
  engine.submit(Request([3, 4, 5], 10, temperature=0.0, on_done=done.append))
  for _ in range(3):  # the prefill's token and a decode step, then two more: four tokens
    engine.step()
  engine.publish(nnx.state(other), version=7)
  while not engine.idle():
    engine.step()
  cand = done[0].candidates[0]
  assert cand.versions == [0] * 4 + [7] * 6 and done[0].policy_version == 0
  np.testing.assert_allclose(cand.logprobs, _recomputed({0: model, 7: other}, 1.0, [3, 4, 5],
                                                        cand), atol=1e-5, rtol=0)


@pytest.mark.parametrize("restart", [False, True])
def test_partial_rollouts_log_each_tokens_version_and_its_logprob(model, restart):
  """Weights swapped while groups decode: each candidate continues on the new weights
  (its context recomputed under them), or with restart starts again from the prompt;
  every token's logged version and log-probability equal a recomputation under that
  version's weights (float32, 1e-5)."""
  other = Decoder(CFG, rngs=nnx.Rngs(1))
  engine = Engine(model, num_pages=64, page_size=4, max_rows=16)
  results = {}
  for i, r in enumerate(_requests(max_tokens=14, temperature=0.8, seed=2)):
    engine.submit(dataclasses.replace(r, on_done=functools.partial(results.__setitem__, i)))
  for _ in range(5):
    engine.step()
  engine.publish(nnx.state(other.for_sampling()), 1, restart_before=1 if restart else None)
  while not engine.idle():
    engine.step()
  mixed = 0
  for i, prompt in enumerate(PROMPTS):
    for cand in results[i].candidates:
      assert len(cand.versions) == len(cand.tokens) == len(cand.logprobs)
      assert cand.versions == sorted(cand.versions)
      mixed += len(set(cand.versions)) == 2
      if restart:
        assert set(cand.versions) == {1}
      np.testing.assert_allclose(cand.logprobs, _recomputed({0: model, 1: other}, 0.8, prompt,
                                                            cand), atol=1e-5, rtol=0)
  assert (mixed == 0) if restart else (mixed > 0)
  assert (engine.stats["restarted"] > 0) == restart


def test_a_warmed_up_engine_compiles_nothing_for_requests(model):
  """Started with warmup, an idle engine compiles every shape its steps can meet; then
  requests of every size it serves (one row to more than it holds, short and long
  prompts, several chunks of prefill, pages past the first table width) compile nothing
  more."""
  import time
  engine = Engine(model, num_pages=80, page_size=8, max_rows=4, prefill_tokens=16,
                  warmup=True).start()
  deadline = time.time() + 300
  while engine.warm and time.time() < deadline:
    time.sleep(0.2)
  assert not engine.warm  # a shape leaves the list once its call returned
  programs_ = (engine.programs.decode, engine.programs.forward, programs.sample)
  compiled = [p._cache_size() for p in programs_]
  rng = np.random.default_rng(0)
  done = []
  for n_rows, length in ((1, 3), (3, 20), (6, 70), (7, 40)):
    for _ in range(n_rows):
      engine.submit(Request(rng.integers(1, 60, length).tolist(), 6, temperature=1.0,
                            on_done=done.append))
    time.sleep(0.3)  # some decode while the next ones arrive
  engine.stop()  # finishes every request
  assert len(done) == 17 and all(r.error is None for r in done)
  assert [p._cache_size() for p in programs_] == compiled


def test_stop_with_cancel_fails_what_is_in_flight_and_frees_every_page(model):
  engine = Engine(model, num_pages=64, page_size=4, max_rows=8).start()
  done = []
  for r in _requests(max_tokens=80, temperature=1.0):
    engine.submit(dataclasses.replace(r, on_done=done.append))
  engine.stop(cancel=True)
  assert len(done) == len(PROMPTS)
  assert all(r.error is not None or all(c.finish_reason for c in r.candidates) for r in done)
  assert any(r.error is not None for r in done)  # 80 tokens each could not all be done
  assert engine.pool.used() == 0 and engine.idle()
  later = []
  engine.start().submit(Request([3, 4, 5], 6, on_done=later.append))  # it runs again
  engine.stop()
  assert later[0].error is None and len(later[0].candidates[0].tokens) == 6


def test_stops_and_lengths(model):
  greedy = Engine(model, num_pages=64, page_size=4, max_rows=4).generate(
      [Request([3, 4, 5], 8, temperature=0.0)])[0].candidates[0]
  stop = greedy.tokens[2]
  got = Engine(model, num_pages=64, page_size=4, max_rows=4).generate(
      [Request([3, 4, 5], 8, temperature=0.0, stop_tokens=(stop,)),
       Request([3, 4, 5], 8, temperature=0.0, stop_check=lambda c, toks: len(toks) == 2),
       Request([t % 60 + 1 for t in range(91)], 50, temperature=0.0)])
  first_stop = greedy.tokens.index(stop) + 1
  assert got[0].candidates[0].tokens == greedy.tokens[:first_stop]
  assert got[0].candidates[0].finish_reason == "stop"
  assert got[1].candidates[0].tokens == greedy.tokens[:2]
  assert [len(got[2].candidates[0].tokens), got[2].candidates[0].finish_reason] == [5, "length"]


@pytest.mark.parametrize("request_, message", [
    (Request([], 4), "prompt is empty"),
    (Request([1] * 96, 4), "context is 96"),
    (Request([1], 4, n=5), "between 1 and the engine's 4 rows"),
    (Request([1], 4, n=2, rows=[0]), "rows has 1 entries"),
    (Request([1], 0), "max_tokens=0"),
    (Request([1] * 40, 40), "needs 20 pages"),
    (Request([1] * 17, 4, n=4), "need 8 pages"),  # 5 for the prompt, 3 copies of its last
    (Request([1], 4, seed=-1), "seed=-1"),
])
def test_bad_requests_are_refused_by_name(model, request_, message):
  engine = Engine(model, num_pages=8, page_size=4, max_rows=4)
  with pytest.raises(ValueError, match=message):
    engine.submit(request_)


def test_the_pool_counts_references_and_evicts_the_least_recently_used():
  pool = PagePool(6, 2)
  a = pool.allocate(2)
  assert 0 not in a and pool.available() == 3
  pool.register([1, 2, 3, 4], a)
  pool.share(a)
  pool.release(a)
  assert pool.used() == 2
  pool.release(a)
  assert pool.used() == 0 and pool.available() == 5 and len(pool.evictable) == 2
  assert pool.lookup([1, 2, 3, 4, 5], limit=2) == a
  assert pool.lookup([1, 2, 9, 9], limit=2) == a[:1]
  assert pool.lookup([9, 2, 3, 4], limit=2) == []
  pool.lookup([1, 2], limit=1)  # block [1, 2] was used last: [3, 4] goes first
  b = pool.allocate(4)
  assert a[1] in b and a[0] not in b and pool.stats["evictions"] == 1
  assert pool.lookup([1, 2, 3, 4], limit=2) == a[:1]
  assert pool.allocate(2) is None and pool.available() == 1
  with pytest.raises(ValueError, match="released more often"):
    pool.release([a[1]] * 2)
  pool.clear_cache()
  assert pool.lookup([1, 2], limit=1) == [] and pool.available() == 2


def test_pool_sizes_are_few_and_at_most_a_sixteenth_over():
  sizes = {pages.pool_pages(n) for n in range(1, 4097)}
  assert len(sizes) == 8 * 16 + 1  # 16-32, ..., 2048-4096: 16 each; 4096 itself
  for n in range(1, 4097):
    assert max(n, 16) <= pages.pool_pages(n) <= max(n, 16) * 17 / 16


def test_batches_of_other_prompt_lengths_reuse_the_compiled_programs(model):
  """generate's pool is rounded to a few sizes, and the pool's shape is every program's:
  batches whose prompts need other page counts compile nothing once the first has run
  (before, each such batch compiled every program again, and a long GRPO run's
  executables outgrew the process's memory maps)."""
  import jax.monitoring
  from rlcode.sampling import engines, generate
  rng = np.random.default_rng(0)
  # Batches of 11 prompts that need 33 or 34 pages (a pool of 34), alike otherwise.
  lengths = [[20] * 11, [20] * 10 + [8], [8] + [20] * 10, [20] * 5 + [8] + [20] * 5]
  batches = [[rng.integers(1, 60, n).tolist() for n in ls] for ls in lengths]
  needed = [engines.pages_needed(ls, 2, 6, 16) for ls in lengths]
  assert set(needed) == {33, 34} and {pages.pool_pages(n) for n in needed} == {34}, needed
  compiles = []

  def count(event, duration, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(duration)
  generate(model, batches[0], max_new_tokens=6, group_size=2, seed=0, temperature=1.0)
  jax.monitoring.register_event_duration_secs_listener(count)
  try:
    for seed, prompts in enumerate(batches[1:], 1):
      generate(model, prompts, max_new_tokens=6, group_size=2, seed=seed, temperature=1.0)
  finally:
    jax.monitoring.unregister_event_duration_listener(count)
  assert compiles == []
