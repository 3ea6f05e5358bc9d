"""Constrained decoding: a grammar's per-row token mask, from llguidance.

    Grammar.json_schema(tokenizer, vocab_size, schema)   output that parses under a schema
    Grammar.lark(tokenizer, vocab_size, text)            any Lark grammar (%json inside it)
    grammar.matcher() -> Matcher                         one candidate's parser state
    matcher.fill(row)   the allowed tokens as a bitmask row (int32 words, bit t of word
                        t // 32 set when token t may come next)
    matcher.advance(t)  after token t was sampled; matcher.done once only EOS may follow

Why llguidance: it computes a 150k-token mask in tens of microseconds from a
token-byte trie (no per-vocabulary precompilation per grammar, so a request's fresh JSON
schema costs nothing to set up), takes JSON schemas and Lark grammars with JSON embedded,
has no dependencies, and is what vLLM and SGLang call for the same masks. xgrammar
precompiles per grammar (cheap per step, costly per new schema: every request here may
bring one) and outlines-core builds a regex index over the whole vocabulary per schema.

The tokenizer is seen through its bytes (`token_bytes`): a token with no bytes (padding,
BOS, EOS) is special, and a grammar never asks for one except EOS where it may end.
This module must not know about scheduling or HTTP.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import weakref

import numpy as np


def _llguidance():
  import llguidance  # deferred: only constrained requests need it
  return llguidance


class _Vocabulary:
  """What llguidance's TokenizerWrapper reads: each id's bytes and the encoder."""

  def __init__(self, tokenizer, vocab_size: int):
    self.tokens = [_token_bytes(tokenizer, i) for i in range(vocab_size)]
    eos = tuple(tokenizer.eos_ids)
    self.eos_token_id = eos[0] if eos else None
    self.bos_token_id = None
    self.special_token_ids = [i for i, b in enumerate(self.tokens) if not b or i in eos]
    self._tokenizer = tokenizer

  def __call__(self, text) -> list[int]:
    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    return self._tokenizer.encode(text, add_special_tokens=False)


def _token_bytes(tokenizer, token: int) -> bytes:
  try:
    return tokenizer.token_bytes(token)
  except (IndexError, KeyError, ValueError):  # ids past the tokenizer's (a padded vocab)
    return b""


_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ll_tokenizer(tokenizer, vocab_size: int):
  """llguidance's view of `tokenizer` over the model's `vocab_size` ids (built once per
  tokenizer: a large vocabulary takes a moment)."""
  cached = _TOKENIZERS.setdefault(tokenizer, {})
  if vocab_size not in cached:
    llg = _llguidance()
    vocab = _Vocabulary(tokenizer, vocab_size)
    eos = list(tokenizer.eos_ids) or None
    cached[vocab_size] = llg.LLTokenizer(llg.TokenizerWrapper(vocab), n_vocab=vocab_size,
                                         eos_token=eos)
  return cached[vocab_size]


# JSON as json.dumps writes it (", " and ": "), with no free whitespace: a model that may pad
# with spaces can pad until its budget runs out.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def words(vocab_size: int) -> int:
  """int32 words in a bitmask row of `vocab_size` tokens."""
  return (vocab_size + 31) // 32


@dataclasses.dataclass(frozen=True)
class Grammar:
  """A grammar compiled for one tokenizer; `matcher()` per candidate."""

  source: str  # llguidance's grammar text
  tokenizer: object = dataclasses.field(compare=False, repr=False)
  vocab_size: int = 0

  @classmethod
  def lark(cls, tokenizer, vocab_size: int, text: str) -> Grammar:
    llg = _llguidance()
    return cls._checked(llg.LLMatcher.grammar_from_lark(text), tokenizer, vocab_size)

  @classmethod
  def json_schema(cls, tokenizer, vocab_size: int, schema: dict) -> Grammar:
    """Output that is one JSON value valid under `schema` (JSON_STYLE)."""
    llg = _llguidance()
    source = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_STYLE)
    return cls._checked(source, tokenizer, vocab_size)

  @classmethod
  def _checked(cls, source: str, tokenizer, vocab_size: int) -> Grammar:
    llg = _llguidance()
    error = llg.LLMatcher.validate_grammar(source, ll_tokenizer(tokenizer, vocab_size))
    if error and not error.startswith("WARNING"):
      raise ValueError(f"the grammar is not valid: {error}")
    return cls(source, tokenizer, vocab_size)

  def matcher(self) -> Matcher:
    llg = _llguidance()
    return Matcher(llg.LLMatcher(ll_tokenizer(self.tokenizer, self.vocab_size), self.source),
                   self.vocab_size)

  def token_masks(self, completions, width: int) -> np.ndarray:
    """[N, width, words] int32: the bitmask each completion's tokens were sampled under,
    replayed on a fresh matcher (the grammar is deterministic: the engine's masks); every
    bit set past a completion's end. What an update needs to recompute the masked
    distribution's log-probabilities."""
    out = np.full((len(completions), width, words(self.vocab_size)), -1, np.int32)
    for i, tokens in enumerate(completions):
      m = self.matcher()
      for j, tok in enumerate(tokens[:width]):
        m.fill(out[i, j])
        if m.done:  # only EOS may follow: it alone can be sampled
          break
        m.advance(tok)
    return out


class Matcher:
  """One candidate's position in its grammar."""

  def __init__(self, matcher, vocab_size: int):
    self._m, self.vocab_size = matcher, vocab_size

  def fill(self, row: np.ndarray) -> None:
    """Writes the next token's allowed set into `row` (int32 [words(vocab_size)])."""
    if not row.flags["C_CONTIGUOUS"] or row.dtype != np.int32:
      raise ValueError("a bitmask row is a contiguous int32 array")
    self._m.unsafe_compute_mask_ptr(row.ctypes.data, row.size * row.itemsize)

  def advance(self, token: int) -> None:
    if not self._m.consume_token(int(token)):
      raise RuntimeError(f"token {token} broke the grammar: {self._m.get_error()}")

  @property
  def done(self) -> bool:
    """Nothing but EOS may follow: the output is complete."""
    return self._m.is_stopped()

  @property
  def error(self) -> str:
    return self._m.get_error()


@functools.lru_cache(maxsize=None)
def all_allowed(vocab_size: int) -> np.ndarray:
  """The bitmask row of an unconstrained row: every bit set."""
  row = np.full(words(vocab_size), -1, np.int32)
  row.setflags(write=False)
  return row


def allowed(row: np.ndarray, vocab_size: int) -> np.ndarray:
  """A bitmask row as a bool [vocab_size] (tests and checks; the device unpacks its own)."""
  bits = (row[:, None].astype(np.int64) >> np.arange(32)) & 1
  return bits.reshape(-1)[:vocab_size].astype(bool)
