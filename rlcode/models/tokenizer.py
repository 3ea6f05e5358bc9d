"""Tokenizers: Hugging Face tokenizer.json through `tokenizers`, and a byte-level one.

Both expose the same small interface (encode, decode, eos_ids, pad_id,
vocab_size). The byte-level tokenizer is for models trained from scratch: every
UTF-8 byte is a token, so any text round-trips exactly and no vocabulary file
is needed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Protocol


class Tokenizer(Protocol):
  vocab_size: int
  pad_id: int
  eos_ids: tuple[int, ...]

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
  """Bytes 0..255 are tokens 0..255; then <pad>, <bos>, <eos>."""

  pad_id = 256
  bos_id = 257
  eos_id = 258
  vocab_size = 259

  def __init__(self, add_bos: bool = True):
    self.add_bos = add_bos

  @property
  def eos_ids(self) -> tuple[int, ...]:
    return (self.eos_id,)

  def encode(self, text: str) -> list[int]:
    ids = list(text.encode("utf-8"))
    return [self.bos_id] + ids if self.add_bos else ids

  def decode(self, ids: Sequence[int]) -> str:
    data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
    return data.decode("utf-8", errors="replace")


_EOS_TOKENS = ("<|eos|>", "<eos>", "</s>", "<|endoftext|>")
_PAD_TOKENS = ("<|pad|>", "<pad>")


class HFTokenizer:
  """tokenizer.json via the `tokenizers` library; eos/pad from the model's config files.

  When the config files name no eos (or there are none), eos is the
  tokenizer's first token of `_EOS_TOKENS`, and pad, unless named, its first
  of `_PAD_TOKENS`.
  """

  def __init__(self, path: str):
    from tokenizers import Tokenizer as _Tok
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
      raise FileNotFoundError(f"{path}: no tokenizer.json")
    self._tok = _Tok.from_file(file)
    self.vocab_size = self._tok.get_vocab_size()
    directory = os.path.dirname(file)
    eos: list[int] = []
    pad = None
    for name in ("generation_config.json", "config.json"):
      cfg_path = os.path.join(directory, name)
      if os.path.isfile(cfg_path):
        with open(cfg_path) as f:
          cfg = json.load(f)
        value = cfg.get("eos_token_id")
        if value is not None and not eos:
          eos = list(value) if isinstance(value, list) else [value]
        if pad is None and cfg.get("pad_token_id") is not None:
          pad = cfg["pad_token_id"]
    if not eos:
      # No model config beside it (a tokenizer trained here, data/code_bpe.json):
      # the tokenizer's own end-of-sequence and padding tokens.
      eos = [i for i in map(self._tok.token_to_id, _EOS_TOKENS) if i is not None][:1]
      if pad is None:
        pad = next((i for i in map(self._tok.token_to_id, _PAD_TOKENS) if i is not None), None)
    self.eos_ids = tuple(eos)
    self.pad_id = pad if pad is not None else (eos[0] if eos else 0)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text).ids

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids])


def load_tokenizer(path: str | None) -> Tokenizer:
  """tokenizer.json under `path`, or the byte-level tokenizer for path None/"bytes"."""
  if path in (None, "bytes"):
    return ByteTokenizer()
  return HFTokenizer(path)
