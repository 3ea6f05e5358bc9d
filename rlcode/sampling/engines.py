"""A batch of prompts through the inference engine: what `rlcode.sampling.generate` runs.

    prompts ─► split over the sampler mesh's data shards (contiguous, prompt-major) ─►
    one rlcode.engine.Engine per shard, on that shard's `tensor` devices, each in its
    own thread ─► a request per prompt (n = G, rows = the group's global row indices) ─►
    one Generation, prompt-major

A shard's engine gets a pool that holds all of its rows at their full length (the group's
prompt stored once), rounded up to one of a few sizes (`rlcode.engine.pages.pool_pages`:
the pool's shape is every program's, so batches of other lengths reuse them), unless
`num_pages` says less: then the engine preempts and recomputes. With `min_prompt_len`
(a run's longest prompt) the pool holds every prompt as if it were that long: every batch
of the run then gets the same pool, and the programs compile once, not once a pool size.
Rows finish one by one and free their pages; the batch ends when its last row does.
Randomness is keyed by (seed, global row, position), so the tokens depend on neither the
mesh, nor the page size, nor how the prompts were split.

This module must not know about rewards or training.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Sequence

import numpy as np
from jax.sharding import Mesh

from rlcode.engine import Engine, Request
from rlcode.engine.pages import pool_pages
from rlcode.parallel import sharding

DEFAULT_PAGE_SIZE = 16
# The most prompt tokens prefilled in one engine step (bucketed chunks beside decode).
PREFILL_TOKENS = 2048


def derived_seed(seed: int, *parts: int) -> int:
  """A 32-bit engine seed of any integer seed and the parts that tell its uses apart (an
  agent's turn, a partial rollout's group)."""
  text = ":".join(str(int(x)) for x in (seed, *parts))
  return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little")


def shard_meshes(mesh: Mesh | None) -> list[Mesh | None]:
  """One mesh per engine: each data shard's `tensor` devices (tensor is the mesh's
  innermost axis, so they are consecutive); [None] without a mesh."""
  if mesh is None:
    return [None]
  tensor = mesh.shape.get("tensor", 1)
  return [sharding.make_mesh(tensor=tensor, devices=list(devices))
          for devices in mesh.devices.reshape(-1, tensor)]


def pages_needed(prompt_lengths: Sequence[int], group_size: int, max_new_tokens: int,
                 page_size: int) -> int:
  """Pages that hold every row at its full length with no preemption: each prompt's full
  pages once, and each candidate's own pages after them (its copy of the prompt's last,
  partial page included); plus the scratch page."""
  total = 1
  for n in prompt_lengths:
    shared = n // page_size
    total += shared + group_size * (math.ceil((n + max_new_tokens) / page_size) - shared)
  return total


def shared_pool(batches: Sequence[tuple[int, int, int, int]], mesh: Mesh | None,
                page_size: int = DEFAULT_PAGE_SIZE) -> int:
  """One pool size (pages an engine) for several kinds of batch that a run samples on one
  model, so that their engines share one pool shape and every program compiles once for
  all of them (a training run's rollouts and its evaluations). batches: (prompts a batch,
  longest prompt, group size, max new tokens) each; every batch's prompts split over
  `mesh`'s data shards as `run` splits them. The size is the largest batch's own pool:
  any of them fits without preemption, and the tokens do not depend on the pool."""
  shards = len(shard_meshes(mesh))
  need = [pages_needed([longest] * math.ceil(prompts / shards), group, new_tokens, page_size)
          for prompts, longest, group, new_tokens in batches if prompts]
  return pool_pages(max(need, default=1))


def run(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float,
        top_p: float, top_k: int, group_size: int, stop_tokens: Sequence[int], seed: int,
        mesh: Mesh | None, row_offset: int, page_size: int = DEFAULT_PAGE_SIZE,
        num_pages: int | None = None, experts: bool = False, grammar=None,
        min_prompt_len: int = 0):
  """(tokens [N, max_new_tokens] padded with -1, logprobs, lengths, finished, experts) of
  N = P * G rows, prompt-major; experts (with `experts`, else None): (per row [N,
  max_new_tokens, moe layers, top_k] with -1 where none was recorded, per prompt [its
  length, moe layers, top_k]). Arguments as `rlcode.sampling.generate`'s (checked
  there)."""
  meshes = shard_meshes(mesh)
  shards = [(m, idx) for m, idx in zip(meshes, split(len(prompts), len(meshes))) if idx]
  g = group_size
  results: dict[int, list] = {}
  errors: list[BaseException] = []
  lock = threading.Lock()

  def done(p, result):
    with lock:
      if result.error is not None:
        errors.append(result.error)
      else:
        results[p] = result

  def requests(idx):
    return [Request(prompt=list(prompts[p]), max_tokens=max_new_tokens, n=g,
                    temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                    rows=[row_offset + p * g + c for c in range(g)],
                    stop_tokens=tuple(stop_tokens), experts=experts, grammar=grammar,
                    on_done=lambda res, p=p: done(p, res))
            for p in idx]

  engines = []
  for m, idx in shards:
    lengths = [max(len(prompts[p]), min_prompt_len) for p in idx]
    pages = num_pages or pool_pages(pages_needed(lengths, g, max_new_tokens, page_size))
    engines.append(Engine(model, num_pages=pages, page_size=page_size,
                          max_rows=len(idx) * g, prefill_tokens=PREFILL_TOKENS,
                          prefix_cache=False, mesh=m))
  run_all(engines, [requests(idx) for _, idx in shards])
  if errors:
    raise errors[0]
  if len(results) != len(prompts):
    raise RuntimeError(f"the engines answered {len(results)} of {len(prompts)} prompts")
  candidates = [c for p in range(len(prompts)) for c in results[p].candidates]
  arrays = candidate_arrays(candidates, max_new_tokens, -1)
  if not experts:
    return (*arrays, None)
  return (*arrays, recorded_experts(candidates, [results[p] for p in range(len(prompts))],
                                    max_new_tokens))


def recorded_experts(candidates, results, max_new_tokens: int):
  """(per candidate [N, max_new_tokens, moe layers, top_k], -1 where none was recorded;
  per prompt [its length, moe layers, top_k]) of results whose requests recorded experts;
  None for a dense model (nothing recorded)."""
  shapes = [r.prompt_experts.shape[1:] for r in results if r.prompt_experts is not None]
  if not shapes:
    return None
  out = np.full((len(candidates), max_new_tokens, *shapes[0]), -1, np.int32)
  for r, cand in enumerate(candidates):
    for j, chosen in enumerate(cand.experts):
      if chosen is not None:
        out[r, j] = chosen
  return out, [r.prompt_experts for r in results]


def candidate_arrays(candidates, max_new_tokens: int, pad_id: int):
  """(tokens [N, max_new_tokens] padded with pad_id, logprobs, lengths, finished) of N
  candidates (rlcode.engine.Candidate), in order."""
  n = len(candidates)
  tokens = np.full((n, max_new_tokens), pad_id, np.int32)
  logprobs = np.zeros((n, max_new_tokens), np.float32)
  lengths, finished = np.zeros(n, np.int32), np.zeros(n, bool)
  for r, cand in enumerate(candidates):
    k = len(cand.tokens)
    tokens[r, :k], logprobs[r, :k] = cand.tokens, cand.logprobs
    lengths[r], finished[r] = k, cand.finish_reason == "stop"
  return tokens, logprobs, lengths, finished


def split(n: int, shards: int) -> list[range]:
  """n items (groups, prompt-major) over `shards` engines: contiguous, the first ones
  fuller; engines left without items get empty ranges."""
  per = math.ceil(n / shards)
  return [range(min(i * per, n), min((i + 1) * per, n)) for i in range(shards)]


def run_all(engines: Sequence[Engine | None], requests: Sequence[Sequence[Request]]) -> None:
  """Runs requests[i] on engines[i] to the end: on this thread for one engine, else each
  engine stepping in its own thread (their devices then work at once). A request's
  failure reaches its `on_done`, as `Engine.generate` passes it."""
  busy = [(e, r) for e, r in zip(engines, requests) if r]
  if len(busy) == 1:
    eng, reqs = busy[0]
    for request in reqs:
      eng.submit(request)
    while not eng.idle():
      eng.step()
    return
  finished = False
  try:
    for eng, reqs in busy:
      eng.start()
      for request in reqs:
        eng.submit(request)
    finished = True
  finally:  # a refused request stops every engine, failing what they hold
    for eng, _ in busy:
      eng.stop(cancel=not finished)
