"""data/code_bpe.json: loads through rlcode.models.tokenizer, round-trips, compresses code."""

from __future__ import annotations

import os
import sysconfig

import pytest

from rlcode import rollout
from rlcode.models.tokenizer import HFTokenizer, load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "data", "code_bpe.json")


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(PATH)


def test_loads_with_its_special_tokens(tok):
  assert isinstance(tok, HFTokenizer) and tok.vocab_size == 4096
  # <|pad|>, <|bos|>, <|eos|> are ids 0, 1, 2; encoding prepends <|bos|>, as
  # the byte tokenizer does its BOS, and rollout counts it the same way.
  assert (tok.pad_id, tok.eos_ids) == (0, (2,))
  assert tok.encode("") == [1] and rollout._bos_len(tok) == 1
  assert tok.decode([1, *tok.encode("x = 1")[1:], 2, 0, 0]) == "x = 1"


@pytest.mark.parametrize("text", [
    "def add(a, b):\n    return a + b\n",
    "    \t  trailing  \n\n\n\r\n  mixed line ends\r",
    "π ≈ 3.14159 — naïve café, 東京, emoji 🐍🚀, \x00 nul, \x7f del",
    "<<<<<<< SEARCH\n  x = 1\n=======\n  x = 2\n>>>>>>> REPLACE\n",
    "<eos> and <pad> and <|endoftext|> as plain text",
])
def test_round_trips_any_text(tok, text):
  ids = tok.encode(text)
  assert all(0 <= i < tok.vocab_size for i in ids)
  assert tok.decode(ids) == text


def test_special_spellings_are_the_special_tokens(tok):
  assert tok.encode("a<|eos|>")[2:] == [2] and tok.decode(tok.encode("a<|eos|>")) == "a"


def test_compresses_a_held_out_stdlib_module(tok):
  # difflib.py is held out of training (data/make_tokenizer.py, HELD_OUT_STDLIB).
  with open(os.path.join(sysconfig.get_paths()["stdlib"], "difflib.py"), "rb") as f:
    data = f.read()
  tokens = len(tok.encode(data.decode())) - 1
  assert tokens / len(data) < 0.35  # the byte tokenizer: 1.0
