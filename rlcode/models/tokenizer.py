"""Tokenizers: Hugging Face tokenizer.json through `tokenizers`, and a byte-level one.

Both expose the same small interface (encode, decode, eos_ids, pad_id,
vocab_size). The byte-level tokenizer is for models trained from scratch: every
UTF-8 byte is a token, so any text round-trips exactly and no vocabulary file
is needed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Protocol

from rlcode import paths
from rlcode.models.chat_template import load_chat_template


class Tokenizer(Protocol):
  vocab_size: int
  pad_id: int
  eos_ids: tuple[int, ...]

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...

  def token_bytes(self, token: int) -> bytes: ...


def bos_length(tokenizer: Tokenizer) -> int:
  """How many tokens encode() prepends on its own (a BOS), which a continuation drops."""
  return len(tokenizer.encode(""))


# The special strings of the tool-calling chat format (rlcode.agent.chat), one token each
# in the "bytes+tools" tokenizer, as they are in Qwen2.5's vocabulary.
TOOL_SPECIALS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# The markers of the edit answers (rlcode.data.edits: SWE-RL's reasoning and solution
# tags, the SEARCH/REPLACE and LINES blocks' fences), one token each in "+edits"
# tokenizers, as chat models have their <think> tags: a tiny policy sampling at T=1
# writes such a marker as one draw instead of up to ten (the code BPE spells
# "<<<<<<< LINES" in ten tokens), and an answer takes about half the tokens.
EDIT_SPECIALS = ("<think>", "</think>", "<solution>", "</solution>", "<<<<<<< SEARCH",
                 "<<<<<<< LINES", "=======", ">>>>>>> REPLACE")
# The added-token sets a tokenizer's name may end with, "+tools", "+edits" or both
# ("+tools+edits": the tool tags first, then the edit markers, after the vocabulary).
SPECIAL_SETS = {"tools": TOOL_SPECIALS, "edits": EDIT_SPECIALS}
# The suffix that splits numbers into their digits ("data/code_bpe.json+digits+edits"):
# each digit is one token, so a number is spelled the same wherever it stands. Without
# it the code BPE writes a prompt's line "137|" as "1", "37" but an answer's " 137" as
# " 13", "7", and line 20 is the token "20" in the prompt and " 20" in the answer: a
# policy that copies a line number has to learn the pair for every number. (Llama's
# and Qwen's tokenizers split digits for the same reason.) The vocabulary is unchanged;
# its merges of digits are no longer used. A byte tokenizer's digits are already single
# tokens, so "bytes+digits" is "bytes".
DIGITS = "digits"


class ByteTokenizer:
  """Bytes 0..255 are tokens 0..255; then <pad>, <bos>, <eos>, then `specials`.

  Each special string is one token (ids 259, 260, ...): `encode` matches them in the
  text before falling back to bytes, and `decode` writes them back as their strings.
  """

  pad_id = 256
  bos_id = 257
  eos_id = 258
  chat_template = None  # the compact formats of rlcode.agent.chat serve byte tokenizers

  def __init__(self, add_bos: bool = True, specials: Sequence[str] = ()):
    self.add_bos = add_bos
    self.specials = tuple(specials)
    if len(set(self.specials)) != len(self.specials) or not all(self.specials):
      raise ValueError(f"specials must be distinct non-empty strings, got {self.specials}")
    self._special_ids = {s: 259 + i for i, s in enumerate(self.specials)}
    # Longest first, so a special that contains another wins.
    self._pattern = (re.compile("|".join(re.escape(s) for s in sorted(
        self.specials, key=len, reverse=True))) if self.specials else None)
    self.vocab_size = 259 + len(self.specials)

  @property
  def eos_ids(self) -> tuple[int, ...]:
    return (self.eos_id,)

  def special_id(self, text: str) -> int | None:
    """The id of `text` when it is one token by itself, else None."""
    if text in self._special_ids:
      return self._special_ids[text]
    data = text.encode("utf-8")
    return data[0] if len(data) == 1 else None

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    ids = [self.bos_id] if self.add_bos and add_special_tokens else []
    start = 0
    if self._pattern is not None:
      for m in self._pattern.finditer(text):
        ids += text[start:m.start()].encode("utf-8")
        ids.append(self._special_ids[m.group()])
        start = m.end()
    ids += text[start:].encode("utf-8")
    return ids

  def decode(self, ids: Sequence[int]) -> str:
    out, data = [], bytearray()
    for i in map(int, ids):
      if 0 <= i < 256:
        data.append(i)
      elif 259 <= i < self.vocab_size:
        out.append(data.decode("utf-8", errors="replace"))
        data = bytearray()
        out.append(self.specials[i - 259])
    out.append(data.decode("utf-8", errors="replace"))
    return "".join(out)

  def token_bytes(self, token: int) -> bytes:
    """The bytes one token stands for: a byte token is its raw byte even when it is part
    of a UTF-8 character (which `decode` alone writes as U+FFFD)."""
    return bytes([token]) if 0 <= token < 256 else self.decode([token]).encode("utf-8")


def _byte_chars() -> list[str]:
  """GPT-2's printable character for each byte (the alphabet of byte-level BPEs)."""
  kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
  chars, extra = {}, 0
  for b in range(256):
    if b in kept:
      chars[b] = chr(b)
    else:
      chars[b] = chr(256 + extra)
      extra += 1
  return [chars[b] for b in range(256)]


def byte_tokenizer_json(tokenizer: ByteTokenizer, path: str) -> None:
  """Writes a tokenizer.json (the `tokenizers` library's) that encodes and decodes as
  `tokenizer` does: a byte-level BPE without merges (byte b is token b), <pad>, <bos>,
  <eos> and the specials as added tokens, <bos> prepended if the tokenizer prepends it."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
  vocab = {c: b for b, c in enumerate(_byte_chars())}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(["<pad>", "<bos>", "<eos>"])
  tok.add_tokens([AddedToken(s, normalized=False) for s in tokenizer.specials])
  if tokenizer.add_bos:
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", tokenizer.bos_id)])
  tok.save(path)


_BYTE_OF = {c: b for b, c in enumerate(_byte_chars())}
_EOS_TOKENS = ("<|eos|>", "<eos>", "</s>", "<|endoftext|>")
_PAD_TOKENS = ("<|pad|>", "<pad>")


class HFTokenizer:
  """tokenizer.json via the `tokenizers` library; eos/pad from the model's config files.

  When the config files name no eos (or there are none), eos is the
  tokenizer's first token of `_EOS_TOKENS`, and pad, unless named, its first
  of `_PAD_TOKENS`.
  """

  def __init__(self, path: str, specials: Sequence[str] = (), digits: bool = False):
    from tokenizers import Tokenizer as _Tok
    from tokenizers import pre_tokenizers
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
      raise FileNotFoundError(f"{path}: no tokenizer.json")
    self._tok = _Tok.from_file(file)
    if digits:
      # Digits first, then the file's own pre-tokenizer on each piece (DIGITS).
      steps = [pre_tokenizers.Digits(individual_digits=True)]
      if self._tok.pre_tokenizer is not None:
        steps.append(self._tok.pre_tokenizer)
      self._tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    # Specials the file lacks are appended as single tokens (ids after its vocabulary),
    # as added tokens rather than special ones, so that decoding keeps them (a tool
    # call's tags are part of its text) while it still drops <|bos|> and the like.
    added = [t for t in specials if self._tok.token_to_id(t) is None]
    if added:
      self._tok.add_tokens(added)
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    directory = os.path.dirname(file)
    eos: list[int] = []
    pad = None
    for name in ("generation_config.json", "config.json"):
      cfg_path = os.path.join(directory, name)
      if os.path.isfile(cfg_path):
        with open(cfg_path) as f:
          hf_json = json.load(f)
        value = hf_json.get("eos_token_id")
        if value is not None and not eos:
          eos = list(value) if isinstance(value, list) else [value]
        if pad is None and hf_json.get("pad_token_id") is not None:
          pad = hf_json["pad_token_id"]
    if not eos:
      # No model config beside it (a tokenizer trained here, data/code_bpe.json):
      # the tokenizer's own end-of-sequence and padding tokens.
      eos = [i for i in map(self._tok.token_to_id, _EOS_TOKENS) if i is not None][:1]
      if pad is None:
        pad = next((i for i in map(self._tok.token_to_id, _PAD_TOKENS) if i is not None), None)
    self.eos_ids = tuple(eos)
    self.pad_id = pad if pad is not None else (eos[0] if eos else 0)
    # The checkpoint's chat template, if its directory has one (None otherwise).
    self.chat_template = load_chat_template(directory)

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

  def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """`text`'s ids without special tokens added, and each token's (start, end) characters
    in `text` (a chat template's assistant mask: rlcode.models.chat_template)."""
    out = self._tok.encode(text, add_special_tokens=False)
    return out.ids, [tuple(o) for o in out.offsets]

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids])

  def special_id(self, text: str) -> int | None:
    """The id of `text` when it is one token by itself (an added special token), else None."""
    return self._tok.token_to_id(text)

  def token_bytes(self, token: int) -> bytes:
    """The bytes one token stands for, raw where it holds part of a UTF-8 character: a
    byte-level BPE's piece mapped back through GPT-2's alphabet, a byte-fallback piece
    ("<0xE2>") as its byte; each reading is kept only if it decodes as the token does."""
    text = self.decode([token])
    piece = self._tok.id_to_token(int(token)) or ""
    fallback = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
    if fallback:
      raw = bytes([int(fallback.group(1), 16)])
    elif piece and all(c in _BYTE_OF for c in piece):
      raw = bytes(_BYTE_OF[c] for c in piece)
    else:
      return text.encode("utf-8")
    return raw if raw.decode("utf-8", errors="replace") == text else text.encode("utf-8")


def split_tokenizer_name(name: str) -> tuple[str, tuple[str, ...], bool]:
  """(base, added specials, digits split) of a tokenizer name:
  "data/code_bpe.json+digits+tools+edits" -> ("data/code_bpe.json", TOOL_SPECIALS +
  EDIT_SPECIALS, True); a name without a known suffix is its own base."""
  specials: tuple[str, ...] = ()
  digits = False
  while True:
    base, plus, suffix = name.rpartition("+")
    if plus and suffix == DIGITS:
      name, digits = base, True
    elif plus and suffix in SPECIAL_SETS:
      name, specials = base, SPECIAL_SETS[suffix] + specials
    else:
      return name, specials, digits


def is_byte_tokenizer(name: str | None) -> bool:
  """Whether `name` is the byte-level tokenizer ("bytes", "bytes+tools", ...)."""
  return name is None or split_tokenizer_name(name)[0] == "bytes"


def load_tokenizer(path: str | None) -> Tokenizer:
  """tokenizer.json under `path`, or a byte-level tokenizer (path None or "bytes").

  A name may end with added-token sets (SPECIAL_SETS): "+tools" (TOOL_SPECIALS), "+edits"
  (EDIT_SPECIALS) or both, each string then one token: "bytes+tools" has the tool tags
  after its bytes; "PATH+tools" is PATH's tokenizer with them added where it lacks them,
  after its vocabulary (for example "data/code_bpe.json+tools": 4096 + 4 tokens). And
  "+digits" (DIGITS): every digit one token."""
  if path is None:
    return ByteTokenizer()
  base, specials, digits = split_tokenizer_name(path)
  if base == "bytes":
    return ByteTokenizer(specials=specials)
  # A name relative to the repository, from any directory.
  return HFTokenizer(paths.resolve(base), specials=specials, digits=digits)
