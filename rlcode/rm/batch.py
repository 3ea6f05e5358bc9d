"""Choices and (prompt, candidate) pairs as the reward model's token arrays (host side).

A row is the prompt's tokens, the candidate's tokens and one end-of-sequence token (the
position "last" pooling reads). A row longer than the context keeps its last max_len
tokens: the candidate's end, where the score is read, is never cut; callers count such
rows. Lengths are padded to multiples of 32 so the jitted steps compile for few shapes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlcode.kernels.tiling import round_up
from rlcode.data.choices import Choice
from rlcode.models.tokenizer import Tokenizer

LENGTH_MULTIPLE = 32


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ChoiceBatch:
  """B choices of up to K candidates, each candidate a row of L tokens.

  tokens [B, K, L] int32 (right-padded); start [B, K]: the candidate's first position;
  length [B, K]: tokens in the row; valid [B, K]: 1 for a real candidate (padding slots
  repeat candidate 0 so that every array stays well defined); chosen [B]; weight [B]: 0
  for rows that only pad the batch; features [B, K, F] float32 (F may be 0).
  """

  tokens: jax.Array
  start: jax.Array
  length: jax.Array
  valid: jax.Array
  chosen: jax.Array
  weight: jax.Array
  features: jax.Array

  @classmethod
  def abstract(cls, rows: int, k: int, num_features: int) -> ChoiceBatch:
    """Leaves of the right rank and row count (for shardings before data exists)."""
    s = lambda shape, dt=jnp.int32: jax.ShapeDtypeStruct(shape, dt)
    return cls(tokens=s((rows, k, LENGTH_MULTIPLE)), start=s((rows, k)), length=s((rows, k)),
               valid=s((rows, k), jnp.float32), chosen=s((rows,)),
               weight=s((rows,), jnp.float32), features=s((rows, k, num_features), jnp.float32))


def encode_pair(tokenizer: Tokenizer, prompt: str, candidate: str,
                max_len: int) -> tuple[list[int], int, bool]:
  """(row tokens, the candidate's first position, whether the row was cut to max_len)."""
  bos = len(tokenizer.encode(""))
  prompt_ids = tokenizer.encode(prompt)
  cand_ids = tokenizer.encode(candidate)[bos:] + list(tokenizer.eos_ids[:1])
  ids = prompt_ids + cand_ids
  cut = max(len(ids) - max_len, 0)
  return ids[cut:], max(len(prompt_ids) - cut, 0), cut > 0


def pair_rows(tokenizer: Tokenizer, prompts: Sequence[str], candidates: Sequence[str],
              max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(tokens [N, L], start [N], length [N], cut [N] bool) for N (prompt, candidate) pairs;
  cut marks rows that lost their first tokens to max_len."""
  encoded = [encode_pair(tokenizer, p, c, max_len) for p, c in zip(prompts, candidates)]
  width = round_up(max(len(ids) for ids, _, _ in encoded), LENGTH_MULTIPLE)
  tokens = np.full((len(encoded), width), tokenizer.pad_id, np.int32)
  for i, (ids, _, _) in enumerate(encoded):
    tokens[i, :len(ids)] = ids
  start = np.array([s for _, s, _ in encoded], np.int32)
  length = np.array([len(ids) for ids, _, _ in encoded], np.int32)
  return tokens, start, length, np.array([c for _, _, c in encoded], bool)


def choice_batch(tokenizer: Tokenizer, choices: Sequence[Choice], *, rows: int, k: int,
                 max_len: int, features: Sequence[str] = ()) -> tuple[ChoiceBatch, int]:
  """(the batch of `choices` padded to `rows` choices of `k` slots, rows cut to max_len)."""
  if not choices or len(choices) > rows:
    raise ValueError(f"choice_batch: need 1..{rows} choices, got {len(choices)}")
  wide = [c for c in choices if c.k > k]
  if wide:
    raise ValueError(f"choice {wide[0].id!r} has {wide[0].k} candidates, more than the "
                     f"batch's {k} slots")
  padded = list(choices) + [choices[0]] * (rows - len(choices))
  prompts = [c.prompt for c in padded for j in range(k)]
  cands = [c.candidates[j if j < c.k else 0] for c in padded for j in range(k)]
  tokens, start, length, cut = pair_rows(tokenizer, prompts, cands, max_len)
  valid = np.array([[j < c.k for j in range(k)] for c in padded], np.float32)
  feats = np.zeros((rows, k, len(features)), np.float32)
  if features:
    for i, c in enumerate(padded):
      f = c.features(features)
      feats[i, :c.k] = f
      feats[i, c.k:] = f[0]
  batch = ChoiceBatch(
      tokens=tokens.reshape(rows, k, -1), start=start.reshape(rows, k),
      length=length.reshape(rows, k), valid=valid,
      chosen=np.array([c.chosen for c in padded], np.int32),
      weight=np.array([1.0] * len(choices) + [0.0] * (rows - len(choices)), np.float32),
      features=feats)
  real = valid * batch.weight[:, None]
  return batch, int(np.sum(cut.reshape(rows, k) * real))
