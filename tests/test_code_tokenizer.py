"""data/code_bpe.json: loads through rlcode.models.tokenizer, round-trips, compresses code."""

from __future__ import annotations

import os
import sysconfig

import pytest

from rlcode.models.tokenizer import HFTokenizer, bos_length, load_tokenizer

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
  assert tok.encode("") == [1] and bos_length(tok) == 1
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


def test_tools_suffix_adds_the_tool_tags_as_single_tokens(tok):
  """"PATH+tools": the tags of a tool call are one token each, after the file's own 4096;
  everything else encodes as before, and decoding keeps the tags but drops <|bos|>."""
  from rlcode.agent.chat import ChatFormat
  from rlcode.models.tokenizer import TOOL_SPECIALS
  tools = load_tokenizer(PATH + "+tools")
  assert tools.vocab_size == 4096 + len(TOOL_SPECIALS)
  assert [tools.special_id(s) for s in TOOL_SPECIALS] == [4096, 4097, 4098, 4099]
  assert tok.special_id("</tool_call>") is None
  call = '<tool_call>{"name":"finish","arguments":{}}</tool_call><tool_response>ok</tool_response>'
  ids = tools.encode(call)
  assert ids[1] == 4096 and 4097 in ids and ids[-1] == 4099
  assert tools.decode(ids) == call
  inner = '{"name":"finish","arguments":{}}'
  assert tools.encode(inner) == tok.encode(inner)
  assert ChatFormat("compact", tools).stop_ids == (4097, 2)


def test_edits_suffix_makes_the_answer_markers_single_tokens(tok):
  """"PATH+edits": each marker of an edit answer is one token after the file's 4096, the
  answer round-trips, text without markers encodes as before; suffixes stack in order."""
  from rlcode.models.tokenizer import EDIT_SPECIALS, TOOL_SPECIALS, split_tokenizer_name
  edits = load_tokenizer(PATH + "+edits")
  assert edits.vocab_size == 4096 + len(EDIT_SPECIALS)
  assert [edits.special_id(s) for s in EDIT_SPECIALS] == list(range(4096, 4104))
  answer = ("<think>\nRename it.\n</think>\n<solution>\n<<<<<<< LINES 29+1\n"
            "def total(xs):\n>>>>>>> REPLACE\n</solution>")
  ids = edits.encode(answer)
  assert edits.decode(ids) == answer
  fence = edits.special_id("<<<<<<< LINES")
  assert ids[ids.index(fence) + 1] == tok.encode(" 29")[1]
  assert sum(i >= 4096 for i in ids) == 6 and len(ids) < len(tok.encode(answer)) / 2
  body = "def total(xs):\n  return sum(xs)\n"
  assert edits.encode(body) == tok.encode(body)
  both = load_tokenizer(PATH + "+tools+edits")
  assert both.special_id("<tool_call>") == 4096 and both.special_id("<think>") == 4100
  assert split_tokenizer_name("dir+x/tok.json+tools+edits") == (
      "dir+x/tok.json", TOOL_SPECIALS + EDIT_SPECIALS, False)
  assert split_tokenizer_name("a+b") == ("a+b", (), False)
  assert split_tokenizer_name("t.json+digits+edits") == ("t.json", EDIT_SPECIALS, True)


def test_digits_suffix_spells_every_number_digit_by_digit(tok):
  """"PATH+digits": every digit is one token, so a line number is the same tokens in a
  prompt's "137|" and an answer's " 137" (the plain BPE spells them "1","37" and " 13",
  "7"); everything round-trips; text without digits encodes as before; the vocabulary
  is the file's."""
  digits = load_tokenizer(PATH + "+digits+edits")
  assert digits.vocab_size == tok.vocab_size + 8

  def pieces(t, text):
    return [t.decode([i]) for i in t.encode(text)[1:]]
  assert pieces(tok, "137|") != ["1", "3", "7", "|"]            # what +digits mends
  assert pieces(digits, "137|    x = f(a2)\n") == [
      "1", "3", "7", "|", "   ", " x", " =", " f", "(", "a", "2", ")", "\n"]
  assert pieces(digits, "<<<<<<< LINES 137+12\n") == [
      "<<<<<<< LINES", " ", "1", "3", "7", "+", "1", "2", "\n"]
  for text in ("x = 3.14159e-10  # 2024\n", "[... lines 1-16 not shown ...]\n",
               "<solution>\n<<<<<<< LINES 9+0\nv = 0x1F\n>>>>>>> REPLACE\n</solution>"):
    assert digits.decode(digits.encode(text)) == text
  body = "def total(xs):\n  return sum(xs)\n"
  assert digits.encode(body) == tok.encode(body)
