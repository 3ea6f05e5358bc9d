"""Packed batches: each group's prompt once, its completions packed into fixed token budgets
(or, without the shared prompt, each completion after its own prompt copy).

The shared layout (rlcode.rl.shared_prefix) pads every completion to the batch's longest;
with heavy-tailed lengths most of its positions are padding. Here each group's G
completions are packed, first fit by decreasing length, into rows of `pack_tokens`
tokens: every group gets K such packs (K the most any group needs), one after another
in a segment of its own (segment ids, kernels.PACKED: each completion attends causally
to itself) at positions that continue its prompt. Every pack attends to its group's
prompt, which runs once, as a shared prefix (Hydragen, as in the shared layout). The
update reads each completion's log-probs back in the shared layout's [N, W] rows (the
hidden state that predicts token j: the prompt's last for j = 0, else the pack position
of token j - 1), so the objective, the corrections, the reference, the teacher and the
metrics read a PackedBatch as they read a GroupedBatch, and give the same loss and
gradients (tests/test_packing.py).

Micro-batches deal whole groups with their packs; `micro_count` cuts them by tokens
(rl.micro_batch_tokens). `padding` says how much of what the update computes is padding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlcode.kernels.tiling import round_up
from rlcode.models.blocks import Packed
from rlcode.rl import logprobs as losses
from rlcode.rl import rollout, sequences, shared_prefix


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PackedBatch:
  """P prompts, their groups' completions packed into P * K rows of T tokens, and the
  completions' [N, W] rows the objective reads.

  prompt_tokens [P, Tp] right-padded, prompt_lengths [P] (as GroupedBatch).
  pack_tokens, pack_segments, pack_positions: [P * K, T] int32, group-major (group p's
  packs are rows p * K .. p * K + K - 1): the tokens, each completion's segment id within
  its pack (non-decreasing; the padding after the last one a segment of its own) and its
  positions (its prompt's length onwards).
  source: [N, W] int32, where completion i's token j is predicted: k * T + t (pack k of
  its group, position t), or -1 (its prompt's last position). completion_tokens: [N, W]
  the completions (the targets). mask, old_logp, ref_logp, weight [N, W] and adv [N] or
  [N, W]: as GroupedBatch's. allow [N, W, words] or None: grammar masks (GroupedBatch's).
  """

  prompt_tokens: jax.Array
  prompt_lengths: jax.Array
  pack_tokens: jax.Array
  pack_segments: jax.Array
  pack_positions: jax.Array
  completion_tokens: jax.Array
  source: jax.Array
  mask: jax.Array
  old_logp: jax.Array
  ref_logp: jax.Array
  adv: jax.Array
  weight: jax.Array
  allow: jax.Array | None = None

  @classmethod
  def abstract(cls, prompts: int, rows: int, allow_words: int | None = None) -> PackedBatch:
    """Leaves with the true prompt and row counts (lengths and pack counts do not matter):
    enough to choose the batch's shardings before the first batch exists."""
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    return cls(prompt_tokens=i32(prompts, 1), prompt_lengths=i32(prompts),
               pack_tokens=i32(prompts, 1), pack_segments=i32(prompts, 1),
               pack_positions=i32(prompts, 1), source=i32(rows, 1),
               completion_tokens=i32(rows, 1), mask=f32(rows, 1), old_logp=f32(rows, 1),
               ref_logp=f32(rows, 1), adv=f32(rows), weight=f32(rows, 1),
               allow=None if allow_words is None else i32(rows, 1, allow_words))

  def micro_batches(self, m: int) -> PackedBatch:
    """Whole groups dealt into m micro-batches (group p, with its packs and rows, to
    micro-batch p % m), each leaf [m, ...]."""
    p = self.prompt_tokens.shape[0]
    runs = {"prompt_tokens": 1, "prompt_lengths": 1,
            **{name: self.pack_tokens.shape[0] // p
               for name in ("pack_tokens", "pack_segments", "pack_positions")}}
    g = self.mask.shape[0] // p
    deal = lambda x, run: None if x is None else sequences.deal(x, m, run)
    return PackedBatch(**{f.name: deal(getattr(self, f.name), runs.get(f.name, g))
                          for f in dataclasses.fields(self)})

  def computed_tokens(self) -> int:
    """Token positions the update's decoder runs: each prompt once and every pack."""
    return int(np.size(self.prompt_tokens) + np.size(self.pack_tokens))


def packed_logprobs(model, batch: PackedBatch, temperature: float):
  """Log-probabilities and entropies [N, W] of the completion tokens."""
  p = batch.prompt_tokens.shape[0]
  n, w = batch.completion_tokens.shape
  packs, t = batch.pack_tokens.shape
  prefix = None
  if batch.prompt_tokens.shape[1]:  # the shared layout; [P, 0]: the prompts are in the packs
    h_prompt, prefix = shared_prefix.prompt_prefix(model, batch.prompt_tokens,
                                                   batch.prompt_lengths)
  h_pack, _ = model.hidden(batch.pack_tokens, batch.pack_positions, prefix=prefix,
                           segment_ids=Packed(batch.pack_segments))
  if prefix is None:  # no source reads it (an empty completion's, masked, aside)
    last = jnp.zeros((p, 1, h_pack.shape[-1]), h_pack.dtype)
  else:
    last = jnp.take_along_axis(h_prompt, (batch.prompt_lengths - 1)[:, None, None], axis=1)
  # Per group: its packs' states, then its prompt's last (source -1, at index K * T).
  table = jnp.concatenate([h_pack.reshape(p, (packs // p) * t, -1), last], axis=1)
  src = jnp.where(batch.source < 0, table.shape[1] - 1, batch.source).reshape(p, (n // p) * w)
  h = jnp.take_along_axis(table, src[..., None], axis=1).reshape(n, w, -1)
  return losses.hidden_logprobs(model.logits, h, batch.completion_tokens, temperature,
                               model.cfg.logits_chunk, batch.allow)


def logprob_fn(temperature: float):
  """For grpo.make_update_step / make_logprob_fn / make_proximal_fn."""
  return lambda model, batch: packed_logprobs(model, batch, temperature)


def first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
  """Indices of `lengths` in bins of `capacity`, first fit by decreasing length (ties in
  index order); empty items take no bin."""
  bins, room = [], []
  for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
    if lengths[i] == 0:
      continue
    if lengths[i] > capacity:
      raise ValueError(f"a sequence of {lengths[i]} tokens does not fit in a pack of "
                       f"{capacity}")
    k = next((k for k, r in enumerate(room) if r >= lengths[i]), None)
    if k is None:
      bins.append([])
      room.append(capacity)
      k = len(bins) - 1
    bins[k].append(i)
    room[k] -= lengths[i]
  return bins


def packed_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], *,
                 pad_id: int, completion_len: int, pack_tokens: int, old_logp=None,
                 adv=None, masks=None, prompt_multiple: int = shared_prefix.PROMPT_MULTIPLE,
                 min_prompt_len: int = 0, min_packs: int = 1,
                 shared: bool = True) -> PackedBatch:
  """Host arrays of the packed layout.

  prompts: P token lists; completions: P * G token lists, prompt-major (as
  shared_prefix.grouped_batch, whose other arguments these are). pack_tokens: T, each
  pack's budget (at least the longest completion). min_packs: at least this many packs a
  group (processes or steps that want one shape). shared=False: the repeated layout packed
  (rlcode.rl.sequences' computation without its padding): each completion's segment
  holds its own copy of its prompt (positions from 0; T at least the longest prompt plus
  completion), no prefix runs, and prompt_tokens is [P, 0].
  """
  grouped = shared_prefix.grouped_batch(prompts, completions, pad_id=pad_id,
                                        completion_len=completion_len, old_logp=old_logp,
                                        adv=adv, prompt_multiple=prompt_multiple, masks=masks,
                                        min_prompt_len=min_prompt_len)
  p, n = len(prompts), len(completions)
  g = n // p
  lengths = [len(c) for c in completions]
  # Each segment: its completion, after its own prompt copy in the repeated layout.
  own = [0 if shared else len(prompts[q]) for q in range(p)]
  items = [own[i // g] + c if c else 0 for i, c in enumerate(lengths)]
  bins = [first_fit(items[q * g:(q + 1) * g], pack_tokens) for q in range(p)]
  k = max([min_packs] + [len(b) for b in bins])
  tokens = np.full((p * k, pack_tokens), pad_id, np.int32)
  segments = np.zeros((p * k, pack_tokens), np.int32)
  positions = np.zeros((p * k, pack_tokens), np.int32)
  source = np.full((n, completion_len), -1, np.int32)
  for q in range(p):
    plen = len(prompts[q])
    for b, members in enumerate(bins[q]):
      row, at = q * k + b, 0
      for s, j in enumerate(members):
        i = q * g + j
        c, o = lengths[i], own[q]
        tokens[row, at:at + o + c] = [*prompts[q][:o], *completions[i]]
        segments[row, at:at + o + c] = s
        positions[row, at:at + o + c] = np.arange(o + c) + (plen - o)
        # Token 1 onwards is predicted from the pack position of the token before it;
        # token 0 from the prompt's last, in the segment when it holds its prompt.
        source[i, 1:c] = b * pack_tokens + at + o + np.arange(c - 1)
        if o:
          source[i, 0] = b * pack_tokens + at + o - 1
        at += o + c
      segments[row, at:] = len(members)
      positions[row, at:] = plen
  prompt_tokens = grouped.prompt_tokens if shared else np.zeros((p, 0), np.int32)
  return PackedBatch(prompt_tokens=prompt_tokens, prompt_lengths=grouped.prompt_lengths,
                     pack_tokens=tokens, pack_segments=segments, pack_positions=positions,
                     source=source, completion_tokens=grouped.completion_tokens,
                     mask=grouped.mask, old_logp=grouped.old_logp, ref_logp=grouped.ref_logp,
                     adv=grouped.adv, weight=grouped.weight)


def rl_batch(ro: rollout.Rollout, adv: np.ndarray, pad_id: int, max_completion_len: int,
             multiple: int = shared_prefix.COMPLETION_MULTIPLE,
             widths: tuple[int, int] | None = None, *, pack_tokens: int,
             shared: bool = True) -> PackedBatch:
  """The rollout's batch of trained tokens in the packed layout (the window and the
  prompts' padding as shared_prefix.rl_batch's; `shared` as packed_batch's)."""
  completions, behaviour = rollout.trained_completions(ro)
  longest, longest_prompt = widths or rollout.batch_widths(ro)
  length = min(round_up(longest, multiple), max_completion_len)
  batch = packed_batch(ro.prompts, completions, pad_id=pad_id, completion_len=length,
                       pack_tokens=pack_tokens, old_logp=behaviour, adv=adv,
                       prompt_multiple=multiple, min_prompt_len=longest_prompt, shared=shared)
  return sequences.with_grammar_masks(batch, ro, length)


def micro_count(batch: PackedBatch, micro_batch_tokens: int | None, data_parallel: int) -> int:
  """How many micro-batches cut a packed batch into at most `micro_batch_tokens` computed
  tokens each where whole groups allow: the fewest m that divide the groups into runs
  that split over the data-parallel devices and reach that budget (1 when unset), or the
  most such runs when none reaches it."""
  if micro_batch_tokens is None:
    return 1
  p = batch.prompt_tokens.shape[0]
  need = math.ceil(batch.computed_tokens() / micro_batch_tokens)
  allowed = [m for m in range(1, p + 1) if p % m == 0 and (p // m) % data_parallel == 0]
  return next((m for m in allowed if m >= need), allowed[-1] if allowed else 1)


def padding(batch) -> dict[str, float]:
  """The update's padding: the share of the decoder's token positions (prompts and packs,
  or the layout's rows) that hold neither a prompt token nor a trained completion token,
  and how many positions it computes. Reads a PackedBatch, GroupedBatch or SequenceBatch
  on the host (padding_of(counts(batch)))."""
  return padding_of(counts(batch))


def counts(batch) -> np.ndarray:
  """[2] float32: the batch's positions holding a prompt or trained token, and the
  positions the update computes (what processes sum over the parts of one batch)."""
  mask = np.asarray(batch.mask) > 0
  trained = float(np.sum(mask))
  if isinstance(batch, PackedBatch):
    computed, plens = batch.computed_tokens(), np.asarray(batch.prompt_lengths)
    if np.size(batch.prompt_tokens):
      prompts = float(np.sum(plens))
    else:  # each trained row's segment holds its prompt
      g = mask.shape[0] // len(plens)
      prompts = float(np.sum(mask.any(1).reshape(len(plens), g).sum(1) * plens))
  elif isinstance(batch, shared_prefix.GroupedBatch):
    prompts = float(np.sum(batch.prompt_lengths))
    computed = int(np.size(batch.prompt_tokens) + np.size(batch.completion_tokens))
  else:
    prompts, computed = float(np.sum(np.asarray(batch.start) + 1)), int(np.size(batch.tokens))
  return np.array([prompts + trained, computed], np.float32)  # integers: exact below 2**24


def padding_of(real_and_computed) -> dict[str, float]:
  """`padding`'s metrics from `counts` (summed over processes)."""
  real, computed = (float(x) for x in real_and_computed)
  return {"update_padding_frac": 1.0 - real / computed, "update_computed_tokens": int(computed)}
