"""Constrained decoding on the engine: output that always parses under its schema (a property
test over random schemas, checked by jsonschema), behaviour log-probs under the masked
distribution (numpy over a full forward), and the device's unpacking of llguidance's
bitmask."""

import json

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlcode.engine import Engine, Request, programs
from rlcode.engine import grammar as grammar_lib
from rlcode.engine.grammar import Grammar
from rlcode.models import Decoder, ModelConfig
from rlcode.models.tokenizer import load_tokenizer

TOK = load_tokenizer("bytes+tools")
CFG = ModelConfig(vocab_size=264, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, max_seq_len=512)
BUDGET = 400


@pytest.fixture(scope="module")
def model():
  return Decoder(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def engine(model):
  return Engine(model, num_pages=160, page_size=16, max_rows=8)


# Schemas whose every instance is short: bounded strings, arrays and nesting, so that any
# sample completes within BUDGET tokens (an unbounded string could run past any budget).
_leaf = st.one_of(
    st.just({"type": "boolean"}), st.just({"type": "null"}),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 999)),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(lambda vals: {"enum": vals},
              st.lists(st.one_of(st.integers(-9, 9), st.text("abc", max_size=3)),
                       min_size=1, max_size=3, unique=True)))


def _object(children):
  return st.dictionaries(st.from_regex(r"[a-z]{1,4}", fullmatch=True), children,
                         min_size=1, max_size=3).map(
      lambda props: {"type": "object", "properties": props, "required": sorted(props),
                     "additionalProperties": False})


_schema = st.recursive(
    _leaf, lambda children: st.one_of(
        _object(children),
        st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n},
                  children, st.integers(0, 3))), max_leaves=6)


def _text(tokens):
  return TOK.decode([t for t in tokens if t not in TOK.eos_ids])


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=_schema, seed=st.integers(0, 2**32 - 1))
def test_constrained_output_always_parses_under_its_schema(engine, schema, seed):
  g = Grammar.json_schema(TOK, CFG.vocab_size, schema)
  (result,) = engine.generate([Request(TOK.encode("x"), BUDGET, n=3, temperature=1.0,
                                       seed=seed, grammar=g, stop_tokens=TOK.eos_ids)])
  for cand in result.candidates:
    assert cand.finish_reason == "stop", (schema, _text(cand.tokens))
    jsonschema.validate(json.loads(_text(cand.tokens)), schema)


def test_behaviour_logprobs_are_the_masked_distributions(model, engine):
  """Each token's log-probability is log_softmax over the allowed tokens of the logits a
  full forward of prompt + completion gives at its position, at the row's temperature
  (the masks replayed through a fresh matcher)."""
  schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                   "maximum": 999},
                                             "s": {"type": "string", "maxLength": 5}},
            "required": ["n", "s"], "additionalProperties": False}
  g = Grammar.json_schema(TOK, CFG.vocab_size, schema)
  prompt = TOK.encode("give json")
  for temperature in (0.7, 0.0):
    (result,) = engine.generate([Request(prompt, 60, n=2, temperature=temperature, seed=11,
                                         grammar=g, stop_tokens=TOK.eos_ids)])
    for cand in result.candidates:
      full = jnp.asarray([prompt + cand.tokens])
      logits = np.asarray(model(full)[0].astype(jnp.float32))
      matcher = g.matcher()
      row = np.zeros(grammar_lib.words(CFG.vocab_size), np.int32)
      for i, (tok, lp) in enumerate(zip(cand.tokens, cand.logprobs)):
        matcher.fill(row)
        ok = grammar_lib.allowed(row, CFG.vocab_size)
        assert ok[tok]
        z = logits[len(prompt) - 1 + i] / (temperature or 1.0)
        z = np.where(ok, z, -np.inf)
        want = z[tok] - (z.max() + np.log(np.exp(z - z.max()).sum()))
        np.testing.assert_allclose(lp, want, atol=1e-5)
        matcher.advance(tok)
      json.loads(_text(cand.tokens))


def test_unconstrained_rows_beside_constrained_ones_sample_what_they_sample_alone(engine):
  """A grammar changes its own rows only: an unconstrained request decoded in the same
  steps draws the tokens it draws alone."""
  g = Grammar.json_schema(TOK, CFG.vocab_size, {"type": "array", "items": {"type": "boolean"},
                                                 "maxItems": 4})
  free = Request(TOK.encode("abc"), 12, n=2, temperature=1.0, seed=4)
  alone = engine.generate([free])[0]
  both = engine.generate([Request(TOK.encode("abc"), 30, n=2, temperature=1.0, seed=4,
                                  grammar=g), free])
  assert [c.tokens for c in both[1].candidates] == [c.tokens for c in alone.candidates]
  assert all(isinstance(json.loads(_text(c.tokens)), list) for c in both[0].candidates)


def test_device_unpacking_equals_llguidance_bitmask():
  g = Grammar.json_schema(TOK, CFG.vocab_size, {"type": "integer"})
  row = np.zeros(grammar_lib.words(CFG.vocab_size), np.int32)
  g.matcher().fill(row)
  rows = np.stack([row, grammar_lib.all_allowed(CFG.vocab_size)])
  got = np.asarray(jax.jit(programs.unpack_bits, static_argnums=1)(rows, CFG.vocab_size))
  want = grammar_lib.allowed(row, CFG.vocab_size)
  np.testing.assert_array_equal(got[0], want)
  assert got[1].all()
  digits = {TOK.encode(str(d), add_special_tokens=False)[0] for d in range(10)}
  assert set(np.flatnonzero(want)) == digits | {TOK.encode("-", add_special_tokens=False)[0]}


def test_a_schema_that_does_not_compile_is_refused():
  with pytest.raises(ValueError, match="not valid"):
    Grammar.lark(TOK, CFG.vocab_size, "start: undefined_rule\n")


def test_forced_calls_of_tools_whose_parameters_have_definitions(engine):
  """A pydantic-made tool schema refers to its own $defs; forced ("required") over two
  such tools, every call parses and its arguments validate under the tool's schema."""
  from rlcode.serve import constrain, protocol, responses
  params = {"type": "object", "required": ["loc"], "additionalProperties": False,
            "properties": {"loc": {"$ref": "#/$defs/Loc"}},
            "$defs": {"Loc": {"type": "object", "required": ["city"],
                              "additionalProperties": False,
                              "properties": {"city": {"type": "string", "maxLength": 6}}}}}
  tools = [{"type": "function", "function": {"name": n, "parameters": params}}
           for n in ("weather", "time")]
  body = protocol.ChatRequest.model_validate(
      {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools,
       "tool_choice": "required"})
  g = constrain.grammar_for(body, TOK, CFG.vocab_size)
  (result,) = engine.generate([Request(TOK.encode("x"), BUDGET, n=4, temperature=1.0, seed=3,
                                       grammar=g, stop_tokens=TOK.eos_ids)])
  for cand in result.candidates:
    content, calls = responses.tool_calls(_text(cand.tokens))
    assert content is None and len(calls) == 1
    assert calls[0]["function"]["name"] in ("weather", "time")
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), params)
