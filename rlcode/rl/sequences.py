"""The repeated layout of a training batch: each row a prompt followed by its completion.

`SequenceBatch` rows are right-padded to one length with a window of W target positions
per row where that row's completion is predicted; the output layer runs on the window
only (what TRL calls logits_to_keep). The shared-prompt layout is rlcode.rl.shared_prefix.
`sequence_batch` builds the host arrays (with the sampler's recorded experts, for routing
replay, when given); `rl_batch` a rollout's batch of trained tokens;
`sft_batch` prompt + reference rows for supervised steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlcode.data.tasks import Task
from rlcode.kernels.tiling import round_up
from rlcode.models.tokenizer import Tokenizer, bos_length
from rlcode.rl import logprobs, rollout


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SequenceBatch:
  """Rows of prompt + completion, right-padded to one length L, and a window of W target
  positions per row where that row's completion is predicted.

  tokens: [N, L] int32. start: [N] int32, the position whose output predicts the row's
  first completion token (its prompt's length - 1). mask, old_logp, ref_logp, weight:
  [N, W], aligned with the targets tokens[i, start[i] + 1 + j] (mask 1 on completion
  tokens, proximal and reference log-probabilities there, 0 elsewhere; weight the
  importance weight of rlcode.rl.correction, 1 for rows it did not recompute). adv: [N],
  or [N, W] per token (on-policy distillation, rlcode.rl.distill).
  The output layer runs on the W window positions only: a prompt's positions never
  become logits (what TRL calls logits_to_keep).
  experts: [N, L, moe layers, top_k] int32 or None: the experts the sampler chose for
  each token (-1 where none was recorded), which the forward replays (routing replay,
  rlcode.models.moe.route); None: the forward routes.
  allow: [N, W, words] int32 or None: the grammar bitmask each target was sampled under
  (rlcode.engine.grammar.Grammar.token_masks); the log-probs are then the masked
  distribution's, as the engine's were.
  """

  tokens: jax.Array
  start: jax.Array
  mask: jax.Array
  old_logp: jax.Array
  ref_logp: jax.Array
  adv: jax.Array
  weight: jax.Array
  experts: jax.Array | None = None
  allow: jax.Array | None = None

  @classmethod
  def abstract(cls, rows: int, experts: tuple[int, int] | None = None,
               allow_words: int | None = None) -> SequenceBatch:
    """Leaves with the true row count and rank (lengths vary per step and do not matter):
    enough to choose the batch's shardings before the first batch exists. experts:
    (moe layers, top_k) when the batch carries recorded experts."""
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    return cls(tokens=jax.ShapeDtypeStruct((rows, 2), jnp.int32),
               start=jax.ShapeDtypeStruct((rows,), jnp.int32), mask=f32(rows, 1),
               old_logp=f32(rows, 1), ref_logp=f32(rows, 1), adv=f32(rows),
               weight=f32(rows, 1),
               experts=None if experts is None else
               jax.ShapeDtypeStruct((rows, 2, *experts), jnp.int32),
               allow=None if allow_words is None else
               jax.ShapeDtypeStruct((rows, 1, allow_words), jnp.int32))

  def micro_batches(self, m: int) -> SequenceBatch:
    """The rows dealt into m micro-batches (row r to micro-batch r % m), each leaf
    [m, N / m, ...]: every micro-batch spreads over the devices the batch does."""
    return jax.tree.map(lambda x: deal(x, m), self)


def deal(x: jax.Array, m: int, group: int = 1) -> jax.Array:
  """x [N, ...] as [m, N / m, ...], runs of `group` rows dealt round-robin: run i of
  micro-batch k is run i * m + k of x."""
  n = x.shape[0]
  if n % (m * group):
    raise ValueError(f"{n} rows do not deal into {m} micro-batches of whole runs of {group}")
  runs = x.reshape(n // (group * m), m, group, *x.shape[1:]).swapaxes(0, 1)
  return runs.reshape(m, n // m, *x.shape[1:])


def window_hidden(model, batch: SequenceBatch) -> tuple[jax.Array, jax.Array]:
  """Final hidden states [N, W, E] at each row's window positions and the targets [N, W]
  they predict. The decoder runs over every position (attention needs the prompt); the
  last one's state is never read (it predicts nothing), but running it keeps the length
  the batch's multiple, which context parallelism splits."""
  h, _ = model.hidden(batch.tokens, experts=batch.experts)
  w = batch.mask.shape[1]
  pos = jnp.minimum(batch.start[:, None] + jnp.arange(w, dtype=jnp.int32)[None, :],
                    batch.tokens.shape[1] - 2)
  h_window = jnp.take_along_axis(h, pos[..., None], axis=1)
  return h_window, jnp.take_along_axis(batch.tokens, pos + 1, axis=1)


def window_logits(model, batch: SequenceBatch) -> tuple[jax.Array, jax.Array]:
  """Logits [N, W, V] at each row's window positions and the targets [N, W] they predict:
  the output layer runs on the W window positions only."""
  h_window, targets = window_hidden(model, batch)
  return model.logits(h_window), targets


def sequence_logprobs(model, batch: SequenceBatch, temperature: float):
  """Log-probabilities and entropies [N, W] of the targets in each row's window (the
  output layer on the window positions only, in chunks of model.cfg.logits_chunk)."""
  h_window, targets = window_hidden(model, batch)
  return logprobs.hidden_logprobs(model.logits, h_window, targets, temperature,
                                  model.cfg.logits_chunk, batch.allow)



LENGTH_MULTIPLE = 32


def sequence_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                   prompt_index: Sequence[int], *, pad_id: int, old_logp=None,
                   adv=None, window: int | None = None,
                   multiple: int = LENGTH_MULTIPLE,
                   min_prompt_len: int = 0, prompt_experts=None,
                   completion_experts=None) -> SequenceBatch:
  """Host arrays of prompt + completion rows and each row's completion window.

  The window is `window` positions wide (default: the longest completion rounded up to
  a multiple of `multiple`); rows are right-padded to a multiple of `multiple` long
  enough for every row's window after its prompt, and after a prompt of
  `min_prompt_len` tokens (so processes that each build part of one batch agree on its
  length). Multiples rather than powers of two: the update's cost is linear in the
  padded lengths, and the few lengths a run meets compile once each (a larger
  multiple: fewer shapes to compile, more padding).

  old_logp[i] holds the behaviour log-probabilities of completion i's tokens
  (its first len(completions[i]) entries are used).
  prompt_experts[p] [len(prompts[p]), moe layers, k] and completion_experts[i] [at
  least len(completions[i]) - 1, moe layers, k] (routing replay: the experts the
  sampler chose for each token it processed; a row's last token is never processed,
  and a value -1 stands for none recorded) become the batch's `experts`, aligned with
  its tokens; both or neither.
  """
  n = len(completions)
  longest = max(len(c) for c in completions)
  width = round_up(max(longest, 1), multiple) if window is None else window
  if longest > width:
    raise ValueError(f"a completion has {longest} tokens, more than the window of {width}")
  plens = [len(prompts[p]) for p in prompt_index]
  if min(plens) < 1:
    raise ValueError("sequence_batch: a prompt is empty")
  seq_len = round_up(max(max(plens), min_prompt_len) + width, multiple)
  tokens = np.full((n, seq_len), pad_id, np.int32)
  mask = np.zeros((n, width), np.float32)
  old = np.zeros((n, width), np.float32)
  for i, (p, c) in enumerate(zip(prompt_index, completions)):
    prompt = prompts[p]
    tokens[i, :len(prompt)] = prompt
    tokens[i, len(prompt):len(prompt) + len(c)] = c
    mask[i, :len(c)] = 1.0
    if old_logp is not None:
      old[i, :len(c)] = old_logp[i][:len(c)]
  adv = np.zeros((n,), np.float32) if adv is None else np.asarray(adv, np.float32)
  experts = None
  if (prompt_experts is None) != (completion_experts is None):
    raise ValueError("sequence_batch: prompt_experts and completion_experts go together")
  if prompt_experts is not None:
    experts = aligned_experts(prompts, completions, prompt_index, prompt_experts,
                              completion_experts, seq_len)
  return SequenceBatch(tokens=tokens, start=np.asarray(plens, np.int32) - 1, mask=mask,
                            old_logp=old, ref_logp=np.zeros_like(old), adv=adv,
                            weight=np.ones_like(old), experts=experts)


def aligned_experts(prompts, completions, prompt_index, prompt_experts, completion_experts,
                    seq_len: int) -> np.ndarray:
  """[N, seq_len, moe layers, k] int32: row i's prompt's recorded experts, then its
  completion's (a completion's record is cut to its tokens, its last token's left -1:
  the sampler never processed it), -1 past them."""
  out = np.full((len(completions), seq_len, *np.shape(prompt_experts[0])[-2:]), -1, np.int32)
  for i, (p, c) in enumerate(zip(prompt_index, completions)):
    plen = len(prompts[p])
    pe = np.asarray(prompt_experts[p])[:plen]
    out[i, :len(pe)] = pe
    ce = np.asarray(completion_experts[i])[:max(len(c) - 1, 0)]
    out[i, plen:plen + len(ce)] = ce
  return out


def padded_records(records, lengths, width: int) -> np.ndarray:
  """[len(records), width, moe layers, k] int32: record i cut to lengths[i] tokens, -1
  past it."""
  out = np.full((len(records), width, *np.shape(records[0])[-2:]), -1, np.int32)
  for i, (r, n) in enumerate(zip(records, lengths)):
    r = np.asarray(r)[:n]
    out[i, :len(r)] = r
  return out


def rl_batch(ro: rollout.Rollout, adv: np.ndarray, pad_id: int, max_completion_len: int,
             multiple: int = LENGTH_MULTIPLE,
             widths: tuple[int, int] | None = None) -> SequenceBatch:
  batch = _rl_batch(ro, adv, pad_id, max_completion_len, multiple, widths)
  return with_grammar_masks(batch, ro, batch.mask.shape[1])


def with_grammar_masks(batch, ro: rollout.Rollout, width: int):
  """The batch with its targets' grammar masks when the rollout sampled under a grammar
  (`allow`), as it is otherwise."""
  if ro.grammar is None:
    return batch
  completions, _ = rollout.trained_completions(ro)
  return dataclasses.replace(batch, allow=ro.grammar.token_masks(completions, width))


def _rl_batch(ro: rollout.Rollout, adv: np.ndarray, pad_id: int, max_completion_len: int,
              multiple: int = LENGTH_MULTIPLE,
              widths: tuple[int, int] | None = None) -> SequenceBatch:
  """The rollout's batch of trained tokens (`trained_completions`); the window is the
  longest rounded up to a multiple of `multiple`, at most max_completion_len (as
  rlcode.rl.shared_prefix.rl_batch). `widths` (default: `batch_widths(ro)`) pads for
  longer completions and prompts: processes building parts of one batch pass the
  maximum of theirs."""
  completions, behaviour = rollout.trained_completions(ro)
  longest, longest_prompt = widths or rollout.batch_widths(ro)
  window = min(round_up(longest, multiple), max_completion_len)
  gen = ro.generation
  return sequence_batch(ro.prompts, completions, gen.prompt_index,
                        pad_id=pad_id, old_logp=behaviour, adv=adv, window=window,
                        multiple=multiple, min_prompt_len=longest_prompt,
                        prompt_experts=gen.prompt_experts, completion_experts=gen.experts)


def sft_batch(tokenizer: Tokenizer, tasks: Sequence[Task],
              multiple: int = LENGTH_MULTIPLE) -> SequenceBatch:
  """Prompt + reference solution + end-of-sequence, for supervised warm starts; lengths
  padded to multiples of `multiple` (`sequence_batch`)."""
  prompts = rollout.encode_prompts(tokenizer, tasks)
  eos = list(tokenizer.eos_ids[:1])
  targets = [tokenizer.encode(t.reference)[bos_length(tokenizer):] + eos for t in tasks]
  return sequence_batch(prompts, targets, range(len(tasks)), pad_id=tokenizer.pad_id,
                        multiple=multiple)
