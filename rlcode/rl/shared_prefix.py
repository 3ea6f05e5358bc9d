"""GRPO with each group's prompt computed once, forward and backward.

A GRPO group is G completions of one prompt. The naive update runs
prompt + completion for every row, so the prompt's forward and backward run G
times. Here the prompt runs once per group (batch P), its per-layer keys and
values become a `Prefix`, and the P*G completions run against it: each
completion's attention is the log-sum-exp merge of non-causal attention over
the shared prompt (all G completions of a prompt as one query block, as in
Hydragen) and causal attention over its own tokens. Gradients reach the prompt
through its keys and values, once.

The first completion token is predicted from the prompt's last position, which
also runs once per group. Losses and gradients equal the naive
repeated-prompt computation (tests/test_shared_prefix.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlcode.kernels.tiling import round_up
from rlcode.rl import logprobs as losses
from rlcode import sampling
from rlcode.rl import grpo
from rlcode.rl import objective
from rlcode.rl import rollout, sequences
from rlcode.models.decoder import Prefix

PROMPT_MULTIPLE = 32


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GroupedBatch:
  """P prompts and their P*G completions, prompt-major.

  prompt_tokens: [P, Tp] right-padded; prompt_lengths: [P].
  completion_tokens: [N, Tc] right-padded. mask, old_logp, ref_logp, weight: [N, Tc],
  aligned with the completion tokens (mask 1 on real tokens; weight as in
  grpo.SequenceBatch). adv: [N], or [N, Tc] per token (rlcode.rl.distill).
  prompt_experts [P, Tp, moe layers, k] and completion_experts [N, Tc, moe layers, k]
  int32, or None: the experts the sampler chose for each token (-1 where none was
  recorded), replayed by the forward (routing replay, rlcode.models.moe.route).
  allow [N, Tc, words] int32 or None: grammar masks, as sequences.SequenceBatch's.
  """

  prompt_tokens: jax.Array
  prompt_lengths: jax.Array
  completion_tokens: jax.Array
  mask: jax.Array
  old_logp: jax.Array
  ref_logp: jax.Array
  adv: jax.Array
  weight: jax.Array
  prompt_experts: jax.Array | None = None
  completion_experts: jax.Array | None = None
  allow: jax.Array | None = None

  @classmethod
  def abstract(cls, prompts: int, rows: int, experts: tuple[int, int] | None = None,
               allow_words: int | None = None) -> GroupedBatch:
    """Leaves with the true prompt and row counts (lengths do not matter): enough to
    choose the batch's shardings before the first batch exists. experts: (moe layers,
    top_k) when the batch carries recorded experts."""
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    ex = (lambda n: None) if experts is None else (lambda n: i32(n, 1, *experts))
    return cls(prompt_tokens=i32(prompts, 1), prompt_lengths=i32(prompts),
               completion_tokens=i32(rows, 1), mask=f32(rows, 1), old_logp=f32(rows, 1),
               ref_logp=f32(rows, 1), adv=f32(rows), weight=f32(rows, 1),
               prompt_experts=ex(prompts), completion_experts=ex(rows),
               allow=None if allow_words is None else i32(rows, 1, allow_words))

  def micro_batches(self, m: int) -> GroupedBatch:
    """Whole groups dealt into m micro-batches (prompt p, with its G rows, to micro-batch
    p % m), each leaf [m, ...]: a group's prompt still runs once."""
    p = self.prompt_tokens.shape[0]
    g = self.completion_tokens.shape[0] // p
    prompts = {"prompt_tokens", "prompt_lengths", "prompt_experts"}
    deal = lambda name, x: None if x is None else sequences.deal(
        x, m, 1 if name in prompts else g)
    return GroupedBatch(**{f.name: deal(f.name, getattr(self, f.name))
                           for f in dataclasses.fields(self)})


def prompt_prefix(model, prompt_tokens_pt, prompt_lengths_p, experts=None):
  """The prompts' final hidden states [P, Tp, E] and their per-layer keys/values
  (experts: the prompts' recorded experts, replayed)."""
  h, kvs = model.hidden(prompt_tokens_pt, experts=experts)
  return h, Prefix(k=tuple(k for k, _ in kvs), v=tuple(v for _, v in kvs),
                   lengths=prompt_lengths_p)


def grouped_logprobs(model, batch: GroupedBatch, temperature: float):
  """Log-probabilities and entropies [N, Tc] of the completion tokens."""
  p = batch.prompt_tokens.shape[0]
  n = batch.completion_tokens.shape[0]
  h_prompt, prefix = prompt_prefix(model, batch.prompt_tokens, batch.prompt_lengths,
                                   batch.prompt_experts)
  h_comp, _ = model.hidden(batch.completion_tokens, prefix=prefix,
                           experts=batch.completion_experts)
  last = jnp.take_along_axis(h_prompt, (batch.prompt_lengths - 1)[:, None, None], axis=1)
  # Position t predicts completion token t: the prompt's last state, then the
  # completion's own states shifted by one.
  h = jnp.concatenate([jnp.repeat(last, n // p, axis=0), h_comp[:, :-1]], axis=1)
  return losses.hidden_logprobs(model.logits, h, batch.completion_tokens, temperature,
                               model.cfg.logits_chunk, batch.allow)


def logprob_fn(temperature: float):
  """For grpo.make_update_step / make_logprob_fn."""
  return lambda model, batch: grouped_logprobs(model, batch, temperature)


def grouped_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], *,
                  pad_id: int, completion_len: int, old_logp=None, adv=None,
                  padding_side: str = "right", prompt_multiple: int = PROMPT_MULTIPLE,
                  masks=None, min_prompt_len: int = 0, prompt_experts=None,
                  completion_experts=None) -> GroupedBatch:
  """Host arrays for the shared-prefix update.

  prompts: P token lists; completions: P*G token lists, prompt-major.
  completion_len: the padded completion length (the sampling budget, so one shape).
  masks: per completion, 0/1 per token (a multi-turn trajectory trains on its own
  turns, not on the observations between them); default all 1.
  padding_side: how `prompts` arrive when they are arrays padded to one length
  with pad_id: "right" (as given) or "left" (the pads are stripped here; the
  device layout is always right-padded).
  prompt_multiple: prompts are padded to a multiple of this, and for at least
  `min_prompt_len` tokens (processes that each build part of one batch agree on its
  shape).
  prompt_experts[p] [its length, moe layers, k] and completion_experts[i] [at least
  len(completions[i]) - 1, moe layers, k]: routing replay's record (as
  rlcode.rl.sequences.sequence_batch takes it; a left-padded prompt's record is
  unpadded the same way); both or neither.
  """
  if padding_side not in ("left", "right"):
    raise ValueError(f"padding_side={padding_side!r}: expected 'left' or 'right'")
  if padding_side == "left":
    starts = [int(np.argmax(np.asarray(p) != pad_id)) for p in prompts]
    prompts = [list(np.asarray(p)[s:]) for p, s in zip(prompts, starts)]
    if prompt_experts is not None:
      prompt_experts = [np.asarray(e)[s:] for e, s in zip(prompt_experts, starts)]
  p, n = len(prompts), len(completions)
  if n % p:
    raise ValueError(f"{n} completions do not split into groups over {p} prompts")
  lengths = np.array([len(x) for x in prompts], np.int32)
  if lengths.min() < 1:
    raise ValueError("grouped_batch: a prompt is empty")
  longest = max(len(c) for c in completions)
  if longest > completion_len:
    raise ValueError(f"a completion has {longest} tokens, more than completion_len="
                     f"{completion_len}")
  tp = round_up(max(int(lengths.max()), min_prompt_len), prompt_multiple)
  prompt_tokens = np.full((p, tp), pad_id, np.int32)
  for i, x in enumerate(prompts):
    prompt_tokens[i, :len(x)] = x
  tokens = np.full((n, completion_len), pad_id, np.int32)
  mask = np.zeros((n, completion_len), np.float32)
  old = np.zeros((n, completion_len), np.float32)
  for i, c in enumerate(completions):
    tokens[i, :len(c)] = c
    mask[i, :len(c)] = 1.0 if masks is None else masks[i][:len(c)]
    if old_logp is not None:
      old[i, :len(c)] = old_logp[i][:len(c)]
  adv = np.zeros((n,), np.float32) if adv is None else np.asarray(adv, np.float32)
  if (prompt_experts is None) != (completion_experts is None):
    raise ValueError("grouped_batch: prompt_experts and completion_experts go together")
  pe = ce = None
  if prompt_experts is not None:
    pe = sequences.padded_records(prompt_experts, lengths, tp)
    # A completion's last token is never processed by the sampler: nothing to replay.
    ce = sequences.padded_records(completion_experts,
                                  [max(len(c) - 1, 0) for c in completions], completion_len)
  return GroupedBatch(prompt_tokens=prompt_tokens, prompt_lengths=lengths,
                      completion_tokens=tokens, mask=mask, old_logp=old,
                      ref_logp=np.zeros_like(old), adv=adv, weight=np.ones_like(old),
                      prompt_experts=pe, completion_experts=ce)


COMPLETION_MULTIPLE = 32


def rl_batch(ro: rollout.Rollout, adv: np.ndarray, pad_id: int, max_completion_len: int,
             multiple: int = COMPLETION_MULTIPLE,
             widths: tuple[int, int] | None = None) -> GroupedBatch:
  """The rollout's batch of trained tokens (rlcode.rollout.trained_completions),
  completions padded to a multiple of `multiple` of the longest one (at most
  max_completion_len) and prompts to a multiple of it: a few compiled shapes, little
  padding. `widths` as in rlcode.rollout.rl_batch."""
  completions, logprobs = rollout.trained_completions(ro)
  longest, longest_prompt = widths or rollout.batch_widths(ro)
  length = min(round_up(longest, multiple), max_completion_len)
  gen = ro.generation
  batch = grouped_batch(ro.prompts, completions, pad_id=pad_id, completion_len=length,
                        old_logp=logprobs, adv=adv, prompt_multiple=multiple,
                        min_prompt_len=longest_prompt, prompt_experts=gen.prompt_experts,
                        completion_experts=gen.experts)
  return sequences.with_grammar_masks(batch, ro, length)


def update_step(graphdef, optimizer, cfg: objective.LossConfig, mesh, state, example: GroupedBatch,
                **options):
  """grpo.make_update_step with the shared-prefix forward (options: its keywords)."""
  return grpo.make_update_step(graphdef, optimizer, cfg, mesh, state, example,
                               logprob_fn=logprob_fn(cfg.temperature), **options)


def _denominator(mask_nt: np.ndarray, aggregation: str) -> float:
  """What grpo.AGGREGATIONS[aggregation] divides the batch's summed loss by (max_len, a
  constant of the config, left out)."""
  trained = mask_nt > 0  # as grpo.policy_loss reads a mask
  if aggregation == "seq_mean_token_mean":
    return float(trained.any(1).sum())  # sequences with a trained token
  if aggregation == "token_mean":
    return float(trained.sum())
  if aggregation == "seq_mean_token_sum_norm":
    return float(mask_nt.shape[0])
  raise KeyError(f"rl.loss_aggregation={aggregation!r}; known: {sorted(objective.AGGREGATIONS)}")


def drop_idle_groups(batch: GroupedBatch, group_size: int, cfg: objective.LossConfig, *,
                     multiple: int = COMPLETION_MULTIPLE, group_multiple: int = 1
                     ) -> GroupedBatch:
  """The batch less the groups that add nothing to the loss, with the same loss and gradient.

  Without a KL term (beta = 0) a row adds nothing to the clipped surrogate when its
  advantage is 0 (every row of a group whose rewards are all equal, often most of a GRPO
  batch) or its mask is all 0 (a trajectory cut by a budget, masked out whole). Groups
  with no other row are dropped, prompts and all; the completions are cut to the longest
  trained row left, rounded up to `multiple` (a long cut trajectory no longer sets every
  row's width). The kept rows' weights are scaled by the aggregation's denominator of
  the new batch over the old one's (sequences with a trained token, trained tokens, or
  rows), so the loss and the gradient equal the full batch's up to float rounding, which
  the optimiser then sees (Adam magnifies it where a gradient is near 0;
  tests/test_shared_prefix.py). The groups are padded to a power of two (and a
  multiple of `group_multiple`, the batch axes of a mesh; never past the batch's own
  count) with rows that are masked out, so that few shapes compile. At least one group
  stays: a step without signal still steps the optimiser (Adam's moments move with a
  zero gradient).

  The update's token means (clip_frac, ratio, entropy, kl) are then over the kept rows.
  A dropped row cannot make the loss non-finite any more (an infinite ratio times a zero
  advantage). With beta > 0 every trained token carries the KL term (not scaled by the
  weights), and the batch comes back as it was.
  """
  if cfg.beta > 0:
    return batch
  mask = np.asarray(batch.mask)
  adv = np.asarray(batch.adv)
  p, n = len(batch.prompt_lengths), len(adv)
  if n != p * group_size:
    raise ValueError(f"{n} rows do not split into {p} groups of {group_size}")
  live = (mask > 0).any(1) & (adv != 0)
  kept = np.flatnonzero(live.reshape(p, group_size).any(1))
  size = min(round_up(sampling.bucket(len(kept)), group_multiple), p)
  idle = np.setdiff1d(np.arange(p), kept)
  groups = np.concatenate([kept, idle[:size - len(kept)]])
  rows = (groups[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)
  last = max((int(np.flatnonzero(mask[i] > 0).max()) + 1 for i in np.flatnonzero(live)),
             default=1)
  width = min(round_up(last, multiple), mask.shape[1])
  new_mask = mask[rows, :width].copy()
  new_mask[len(kept) * group_size:] = 0.0  # the padding groups train nothing
  old, new = _denominator(mask, cfg.aggregation), _denominator(new_mask, cfg.aggregation)
  scale = new / old if old > 0 else 1.0
  take = lambda x: np.asarray(x)[rows, :width]
  recorded = batch.prompt_experts is not None
  return GroupedBatch(
      prompt_experts=np.asarray(batch.prompt_experts)[groups] if recorded else None,
      completion_experts=take(batch.completion_experts) if recorded else None,
      prompt_tokens=np.asarray(batch.prompt_tokens)[groups],
      prompt_lengths=np.asarray(batch.prompt_lengths)[groups],
      completion_tokens=take(batch.completion_tokens), mask=new_mask,
      old_logp=take(batch.old_logp), ref_logp=take(batch.ref_logp),
      adv=np.where(np.arange(len(rows)) < len(kept) * group_size, adv[rows], 0.0
                   ).astype(np.float32),
      weight=(take(batch.weight) * np.float32(scale)).astype(np.float32))
