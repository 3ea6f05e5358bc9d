"""Generation: `generate` through the inference engine, and the static loop.

`generate` samples through rlcode.engine (rlcode.sampling.engines: one engine per data
shard, paged KV, rows that finish free their pages). What remains of the static loop
(`static_generate`, `prefill`, `decode`) runs models with NSA layers (an NSA layer's cache
is per row and cannot be paged) and host-offloaded prompt KV; the engine's benchmarks
compare against it.

`static_generate` pads prompts on the right into a few bucketed shapes (powers of
two), so a stream of prompts of varying lengths compiles a handful of programs,
not one per length. Two jitted programs: a prefill over each prompt once, then
a `lax.while_loop` of single-token decode steps that stops when every row has
emitted a stop token or the budget is spent. Each of the G samples of a prompt
continues from that prompt's single prefill, and (by default) reads that one
copy of the prompt's KV as a shared prefix instead of a private copy, so the
prompt's KV memory does not grow with G.

Randomness is keyed by (seed, step, row) where the row is the sample's global
index p * G + g (plus `row_offset` when a process samples its share of a larger
batch), so a sample does not depend on how the batch was padded, laid out or split
over processes.

This module must not know about rewards or training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rlcode.parallel import sharding
from rlcode.models.decoder import Decoder, KVCache, Prefix
from rlcode.sampling import engines

MIN_PROMPT_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class Generation:
  """What `generate` returns; rows are prompt-major: (p0, g0), (p0, g1), ...

  Attributes:
    tokens: [N, max_new_tokens] int32 completion tokens; pad_id after the end.
    logprobs: [N, max_new_tokens] float32 log-probabilities of the tokens under
      the distribution they were sampled from (after temperature, top-k and
      top-p); at temperature 0, under the model's own distribution. 0 after
      the end.
    lengths: [N] generated tokens per row, the stop token included.
    finished: [N] True where the row ended with a stop token.
    prompt_index: [N] the prompt each row continues.
    experts: routing replay's record, or None when not asked for: [N, max_new_tokens,
      moe layers, top_k] int32, the experts each MoE layer chose for each completion
      token when it was processed (-1 where none was: a row's last token, padding).
    prompt_experts: with `experts`, per prompt [its length, moe layers, top_k]: the
      experts chosen for its tokens (once per group).
  """

  tokens: np.ndarray
  logprobs: np.ndarray
  lengths: np.ndarray
  finished: np.ndarray
  prompt_index: np.ndarray
  experts: np.ndarray | None = None
  prompt_experts: list | None = None

  def completions(self) -> list[list[int]]:
    return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths)]


def bucket(n: int, minimum: int = 1) -> int:
  """The smallest power of two >= max(n, minimum)."""
  return 1 << (max(n, minimum) - 1).bit_length()


def sample_logits(logits_bv: jax.Array, keys_b: jax.Array, *, temperature: float,
                  top_k: int = 0, top_p: float = 1.0) -> tuple[jax.Array, jax.Array]:
  """One token per row and its log-probability under the sampling distribution."""
  logits_bv = logits_bv.astype(jnp.float32)
  if temperature == 0.0:
    tok = jnp.argmax(logits_bv, axis=-1)
    logp = jax.nn.log_softmax(logits_bv, axis=-1)
    return tok.astype(jnp.int32), jnp.take_along_axis(logp, tok[:, None], -1)[:, 0]
  scaled = logits_bv / temperature
  if top_k > 0:
    kth = jax.lax.top_k(scaled, top_k)[0][:, -1:]
    scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
  if top_p < 1.0:
    desc = jnp.sort(scaled, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(desc, axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always).
    keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p
    threshold = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
    scaled = jnp.where(scaled < threshold, -jnp.inf, scaled)
  logp = jax.nn.log_softmax(scaled, axis=-1)
  tok = jax.vmap(jax.random.categorical)(keys_b, scaled).astype(jnp.int32)
  return tok, jnp.take_along_axis(logp, tok[:, None], -1)[:, 0]


def row_keys(key, step, rows_b):
  """Per-row sampling keys of one decode step: (key, step, row) folded in."""
  step_key = jax.random.fold_in(key, step)
  return jax.vmap(lambda r: jax.random.fold_in(step_key, r))(rows_b)


def _context(mesh):
  return sharding.activate(mesh) if mesh is not None else contextlib.nullcontext()


def _prefill_impl(state, prompt_tokens_pt, prompt_lengths_p, *, graphdef, group_size,
                  max_new_tokens, mesh, share_prompt, offload_kv):
  """Each prompt once: the first tokens' logits [P*G, V], and the KV to decode from.

  With share_prompt: the prompts' KV as a head-major Prefix, and an empty cache
  for the rows' own tokens; without: a cache holding each row's copy.
  """
  with _context(mesh):
    model: Decoder = nnx.merge(graphdef, state)
    g = group_size
    b = prompt_tokens_pt.shape[0] * g
    h, kvs = model.hidden(prompt_tokens_pt)
    last_h = jnp.take_along_axis(h, (prompt_lengths_p - 1)[:, None, None], axis=1)
    first_logits = jnp.repeat(model.logits(last_h)[:, 0], g, axis=0)
    if share_prompt:
      prefix = Prefix(k=tuple(k.swapaxes(1, 2) for k, _ in kvs),
                      v=tuple(v.swapaxes(1, 2) for _, v in kvs), lengths=prompt_lengths_p,
                      head_major=True, on_host=offload_kv)
      return first_logits, prefix, KVCache.zeros(model.cfg, b, max_new_tokens,
                                                 dtype=kvs[0][0].dtype)
    rows = lambda x: jax.tree.map(lambda a: jnp.repeat(a, g, axis=0), x)
    cache = KVCache.from_prefill([rows(kv) for kv in kvs], jnp.repeat(prompt_lengths_p, g),
                                 prompt_tokens_pt.shape[1] + max_new_tokens)
    return first_logits, None, cache


_PREFILL_STATIC = ("graphdef", "group_size", "max_new_tokens", "mesh", "share_prompt",
                   "offload_kv")


@functools.lru_cache(maxsize=None)
def _prefill_fn(mesh: Mesh | None, num_layers: int, offload_kv: bool):
  """The jitted prefill; with offload_kv its Prefix leaves it in pinned host memory.

  Placing the prefix by out_shardings (rather than inside the program) is what
  keeps it on the host on every backend, the CPU included.
  """
  if not offload_kv:
    return jax.jit(_prefill_impl, static_argnames=_PREFILL_STATIC)
  if mesh is None:
    host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    kv = lengths = host
  else:
    kv = jax.sharding.NamedSharding(mesh, sharding.logical_to_spec(
        ("batch", "kv_heads", "length", "head_dim"), mesh=mesh), memory_kind="pinned_host")
    lengths = jax.sharding.NamedSharding(mesh, sharding.logical_to_spec(("batch",), mesh=mesh),
                                         memory_kind="pinned_host")
  prefix = Prefix(k=(kv,) * num_layers, v=(kv,) * num_layers, lengths=lengths,
                  head_major=True, on_host=True)
  return jax.jit(_prefill_impl, static_argnames=_PREFILL_STATIC,
                 out_shardings=(None, prefix, None))


@functools.partial(jax.jit, static_argnames=(
    "graphdef", "max_new_tokens", "temperature", "top_k", "top_p", "stop_tokens", "pad_id",
    "mesh"), donate_argnames=("cache",))
def decode(state, first_logits, prefix, cache, key, done, row_offset=0, *, graphdef,
           max_new_tokens, temperature, top_k, top_p, stop_tokens, pad_id, mesh):
  """The decode loop: one token per row per step until all rows stopped.

  first_logits [B, V] predict each row's first token; `done` [B] marks rows that take
  no part (they sample nothing: length 0, pad tokens); row r draws the randomness of
  global row `row_offset + r` (a process's share of a larger batch; an int, or one per
  row, [B], for a batch whose rows were picked out of a larger one). Returns (tokens
  [B, max_new_tokens], logprobs, lengths [B], done [B] (a row stopped, or was done from
  the start), cache). The returned cache holds each row's tokens but its last one (the
  last token sampled is never fed back); its `lengths` advanced by the number of loop
  steps for every row, so a caller that continues a row resets them (rlcode.agent.sampler).
  """
  with _context(mesh):
    model: Decoder = nnx.merge(graphdef, state)
    b = first_logits.shape[0]
    rows = jnp.arange(b, dtype=jnp.int32) + row_offset
    stops = jnp.asarray(stop_tokens if stop_tokens else (-1,), jnp.int32)

    def record(carry, step, tok, lp):
      out_tok, out_lp, done, n = carry
      live = ~done
      out_tok = out_tok.at[:, step].set(jnp.where(live, tok, pad_id))
      out_lp = out_lp.at[:, step].set(jnp.where(live, lp, 0.0))
      n = n + live.astype(jnp.int32)
      done = done | (live & jnp.any(tok[:, None] == stops[None, :], axis=-1))
      return out_tok, out_lp, done, n

    sample = functools.partial(sample_logits, temperature=temperature, top_k=top_k, top_p=top_p)
    tok, lp = sample(first_logits, row_keys(key, 0, rows))
    out = record((jnp.full((b, max_new_tokens), pad_id, jnp.int32),
                  jnp.zeros((b, max_new_tokens), jnp.float32),
                  done, jnp.zeros((b,), jnp.int32)), 0, tok, lp)

    def cond(loop):
      step, _, _, (_, _, done, _) = loop
      return (step < max_new_tokens) & ~jnp.all(done)

    def body(loop):
      step, tok, cache, out = loop
      h, cache = model.hidden(tok[:, None], cache=cache, prefix=prefix)
      tok, lp = sample(model.logits(h)[:, 0], row_keys(key, step, rows))
      return step + 1, tok, cache, record(out, step, tok, lp)

    _, _, cache, (out_tok, out_lp, done, n) = jax.lax.while_loop(
        cond, body, (jnp.int32(1), tok, cache, out))
    return out_tok, out_lp, n, done, cache


def prefill(model: Decoder, prompts: Sequence[Sequence[int]], *, group_size: int,
            cache_size: int, pad_id: int = 0, mesh: Mesh | None = None,
            share_prompt: bool = True, offload_kv: bool = False, min_prompts: int = 0):
  """Each prompt once; returns (first_logits [B, V], prefix, cache) for `decode`.

  The P prompts are padded into bucketed shapes: P to a power of two (at least the
  mesh's data-parallel size and `min_prompts`), so B = P_pad * group_size rows,
  prompt-major, of which the first P * group_size are real. With share_prompt the prompts' KV is a Prefix
  the G rows of a group read and the cache ([B, cache_size]) is empty; without, the
  cache holds each row's copy of its prompt plus cache_size free positions.
  """
  graphdef, state = nnx.split(model)
  lengths = [len(p) for p in prompts]
  dp = sharding.batch_shards(mesh)
  p = len(prompts)
  p_pad = max(bucket(p), dp, bucket(min_prompts))
  t_pad = bucket(max(lengths), MIN_PROMPT_BUCKET)
  tokens = np.full((p_pad, t_pad), pad_id, np.int32)
  for i, prompt in enumerate(prompts):
    tokens[i, :lengths[i]] = prompt
  prompt_lengths = np.ones((p_pad,), np.int32)
  prompt_lengths[:p] = lengths
  tokens, prompt_lengths = jnp.asarray(tokens), jnp.asarray(prompt_lengths)
  if mesh is not None:
    with sharding.activate(mesh):
      tokens = jax.device_put(tokens, sharding.logical_sharding(("batch", "length")))
      prompt_lengths = jax.device_put(prompt_lengths, sharding.logical_sharding(("batch",)))
  fn = _prefill_fn(mesh, model.cfg.num_layers, bool(offload_kv))
  return fn(state, tokens, prompt_lengths, graphdef=graphdef, group_size=group_size,
            max_new_tokens=cache_size, mesh=mesh, share_prompt=share_prompt,
            offload_kv=bool(offload_kv))


def generate(model: Decoder, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
             group_size: int = 1, stop_tokens: Sequence[int] = (), seed: int = 0,
             pad_id: int = 0, mesh: Mesh | None = None, share_prompt: bool = True,
             offload_kv: bool = False, row_offset: int = 0, page_size: int = 16,
             num_pages: int | None = None, experts: bool = False,
             grammar=None, min_prompt_len: int = 0) -> Generation:
  """Samples `group_size` completions for each prompt, through the inference engine
  (rlcode.sampling.engines: paged KV, rows that finish free their pages, the group's
  prompt stored once).

  Args:
    model: the decoder.
    prompts: token id lists, of any lengths (at least one token each).
    max_new_tokens: the budget per completion.
    temperature: 0 is greedy.
    top_p, top_k: nucleus and top-k truncation (1.0 and 0 turn them off).
    group_size: samples per prompt, G.
    stop_tokens: a row ends after emitting any of these.
    seed: the sampling seed (outside [0, 2**32), hashed into it: `engines.derived_seed`).
    pad_id: the token written after a row's end.
    mesh: one engine per data shard of this mesh, heads split over its `tensor` axis
      (default: the active mesh, if any).
    share_prompt, offload_kv: for `static_generate`, which models with NSA layers (their
      cache is per row, not pages) and `offload_kv` (the prompts' KV in pinned host
      memory, streamed to the device layer by layer) still run; the engine always stores
      a group's prompt once.
    row_offset: the global index of this call's first row, when the prompts are one
      process's share of a batch: row r draws the randomness of row row_offset + r.
    page_size, num_pages: the engine's pages; by default a pool that holds every row at
      its full length (fewer pages: rows are preempted and recomputed, same tokens).
    min_prompt_len: the default pool holds each prompt as if it had at least this many
      tokens; a caller that passes its longest prompt (of a run, an evaluation) gets one
      pool shape for all its batches, so the engine's programs compile once. The tokens
      do not depend on it.
    experts: record the experts each MoE layer chose for every token (routing replay:
      Generation.experts and prompt_experts; a dense model records nothing, None).
    grammar: an rlcode.engine.grammar.Grammar every completion is constrained by (its
      logprobs then the masked distribution's); a completion ends once it is complete.

  Returns:
    A Generation with P * group_size rows, prompt-major.
  """
  cfg = model.cfg
  if experts and ("nsa" in cfg.layer_kinds or offload_kv):
    raise ValueError("generate: experts are recorded by the engine, which does not run "
                     "models with NSA layers or offload_kv")
  if grammar is not None and ("nsa" in cfg.layer_kinds or offload_kv):
    raise ValueError("generate: a grammar constrains the engine's sampling, which does not "
                     "run models with NSA layers or offload_kv")
  if "nsa" in cfg.layer_kinds or offload_kv:
    return static_generate(model, prompts, max_new_tokens=max_new_tokens,
                           temperature=temperature, top_p=top_p, top_k=top_k,
                           group_size=group_size, stop_tokens=stop_tokens, seed=seed,
                           pad_id=pad_id, mesh=mesh, share_prompt=share_prompt,
                           offload_kv=offload_kv, row_offset=row_offset)
  _check(cfg, prompts, max_new_tokens, group_size, temperature, top_p, top_k)
  if not 0 <= seed < 2 ** 32:  # the engine's keys take 32 bits: any other seed is hashed
    seed = engines.derived_seed(seed)
  mesh = mesh if mesh is not None else sharding.active_mesh()
  tokens, logprobs, lengths, finished, recorded = engines.run(
      model, prompts, max_new_tokens=max_new_tokens, temperature=float(temperature),
      top_p=float(top_p), top_k=int(top_k), group_size=group_size,
      stop_tokens=tuple(int(s) for s in stop_tokens), seed=int(seed), mesh=mesh,
      row_offset=int(row_offset), page_size=page_size, num_pages=num_pages,
      experts=experts, grammar=grammar, min_prompt_len=int(min_prompt_len))
  tokens[tokens < 0] = pad_id
  row_experts, prompt_experts = recorded if recorded is not None else (None, None)
  return Generation(tokens=tokens, logprobs=logprobs, lengths=lengths, finished=finished,
                    prompt_index=np.repeat(np.arange(len(prompts)), group_size),
                    experts=row_experts, prompt_experts=prompt_experts)


def _check(cfg, prompts, max_new_tokens, group_size, temperature, top_p, top_k) -> None:
  """One clear error for arguments no sampler can honour."""
  if not prompts:
    raise ValueError("generate: no prompts")
  if max_new_tokens < 1:
    raise ValueError(f"generate: max_new_tokens={max_new_tokens} must be at least 1")
  if group_size < 1:
    raise ValueError(f"generate: group_size={group_size} must be at least 1")
  if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
    raise ValueError(f"generate: temperature={temperature} top_p={top_p} top_k={top_k} "
                     "must satisfy temperature >= 0, 0 < top_p <= 1, top_k >= 0")
  lengths = [len(p) for p in prompts]
  for i, n in enumerate(lengths):
    if n == 0:
      raise ValueError(f"generate: prompt {i} is empty")
    if n + max_new_tokens > cfg.max_seq_len:
      raise ValueError(f"generate: prompt {i} has {n} tokens; with max_new_tokens="
                       f"{max_new_tokens} that exceeds the model's context of "
                       f"{cfg.max_seq_len} tokens")


def static_generate(model: Decoder, prompts: Sequence[Sequence[int]], *,
                    max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                    top_k: int = 0, group_size: int = 1, stop_tokens: Sequence[int] = (),
                    seed: int = 0, pad_id: int = 0, mesh: Mesh | None = None,
                    share_prompt: bool = True, offload_kv: bool = False,
                    row_offset: int = 0) -> Generation:
  """`generate` in one static batch: a bucketed prefill, then one `lax.while_loop` until
  the longest row stops (finished rows keep computing; each row's cache allocated whole).
  What `generate` runs for models with NSA layers and for host-offloaded KV, and what the
  engine's benchmarks compare against.

  Arguments as `generate`'s (its `seed` any integer), and:
    share_prompt: with group_size > 1, keep one copy of each prompt's KV that
      its G rows read as a shared prefix (decode attention merges prefix and
      own-token parts by log-sum-exp); False gives every row its own copy.
      Same samples either way. Models with NSA layers always take the
      per-row layout (an NSA layer's cache is per row).
    offload_kv: keep the prompts' KV in pinned host memory and bring each
      layer's part to the device while the layer before it computes (implies
      the shared-prompt layout). Same samples; on a GPU it trades device
      memory for host-to-device bandwidth.
  """
  cfg = model.cfg
  has_nsa = "nsa" in cfg.layer_kinds
  if has_nsa and offload_kv:
    raise ValueError("generate: offload_kv is not implemented for models with NSA layers "
                     "(their cache is per row, not a shared prompt prefix)")
  _check(cfg, prompts, max_new_tokens, group_size, temperature, top_p, top_k)
  mesh = mesh if mesh is not None else sharding.active_mesh()
  model = model.for_sampling()
  graphdef, state = nnx.split(model)
  # An NSA layer's cache (compressed tokens, selection) is per row: no shared prompt.
  share = not has_nsa and (bool(offload_kv) or (bool(share_prompt) and group_size > 1))
  first_logits, prefix, cache = prefill(
      model, prompts, group_size=group_size, cache_size=max_new_tokens,
      pad_id=pad_id, mesh=mesh, share_prompt=share, offload_kv=bool(offload_kv))
  p = len(prompts)
  out_tok, out_lp, n, done, _ = decode(
      state, first_logits, prefix, cache, jax.random.key(seed),
      jnp.zeros((first_logits.shape[0],), bool), jnp.int32(row_offset), graphdef=graphdef,
      max_new_tokens=max_new_tokens, temperature=float(temperature), top_k=int(top_k),
      top_p=float(top_p), stop_tokens=tuple(int(s) for s in stop_tokens), pad_id=int(pad_id),
      mesh=mesh)
  keep = p * group_size
  return Generation(tokens=np.asarray(out_tok)[:keep], logprobs=np.asarray(out_lp)[:keep],
                    lengths=np.asarray(n)[:keep], finished=np.asarray(done)[:keep],
                    prompt_index=np.repeat(np.arange(p), group_size))
