"""The engine's sampling program for one `data` shard: its pool of pages, compiled abstractly.

Sampling runs one inference engine (rlcode.engine) per data shard of the sampler mesh, the
model's heads split over that shard's `tensor` devices. The engine neither splits a
sequence nor gathers weights, so every mesh axis but `tensor` (data, fsdp, expert,
context) holds engines of its own: engines = sampler devices / tensor, each taking
ceil(prompts / engines) groups whole.

`engine_pool` sizes one engine's pool for its live tokens at the end of sampling: each
prompt stored once (its G rows share its pages), each row's own pages (the copy of the
prompt's partial last page and the completion), and the scratch page, rounded up to the
pool size `generate` allocates. `compile_decode`
lowers the engine's decode program (`rlcode.engine.programs.for_graph(graph).decode`,
what every engine step runs, pools donated) on a sub-mesh of one shard's tensor devices, from ShapeDtypeStructs.

This module must not allocate a model or run a step.
"""

from __future__ import annotations

import dataclasses
import math

from rlcode.engine.engine import MIN_ROWS, bucket
from rlcode.engine import programs
from rlcode.engine.pages import pool_pages
from rlcode.parallel import sharding
from rlcode.sampling import engines


@dataclasses.dataclass(frozen=True)
class EnginePool:
  """One engine's share of a sampling batch, and the pool its live tokens need.

  Attributes:
    engines: engines over the sampler mesh (its devices / tensor).
    prompts: groups one engine holds (prompts / engines, rounded up).
    rows: that engine's rows (prompts x group size).
    batch_rows: the rows a decode step is compiled for (`rows` bucketed as the engine does).
    page_size: positions per page.
    prompt_pages: pages of one prompt, stored once for its rows.
    row_pages: one row's own pages (its copy of the prompt's partial last page and its
      completion).
    pages: the pool: every prompt's pages, every row's own, and the scratch page, rounded
      up as `rlcode.sampling.generate` rounds them (rlcode.engine.pages.pool_pages).
    table_width: page-table columns per row (prompt and completion).
    live_tokens: positions the engine holds at the end (its prompts once, its completions).
  """

  engines: int
  prompts: int
  rows: int
  batch_rows: int
  page_size: int
  prompt_pages: int
  row_pages: int
  pages: int
  table_width: int
  live_tokens: int

  @property
  def overhead(self) -> float:
    """Pool positions per live token: pool bytes over the live tokens' own KV bytes."""
    return self.pages * self.page_size / self.live_tokens


def engine_pool(prompts: int, group: int, prompt_len: int, completion_len: int, engines: int,
                page_size: int) -> EnginePool:
  """The pool one of `engines` engines needs for its share of `prompts` groups of `group`
  rows (see the module docstring)."""
  for name, value in (("prompts", prompts), ("group", group), ("prompt_len", prompt_len),
                      ("completion_len", completion_len), ("engines", engines),
                      ("page_size", page_size)):
    if value < 1:
      raise ValueError(f"engine_pool: {name}={value} must be at least 1")
  held = math.ceil(prompts / engines)
  rows = held * group
  prompt_pages = math.ceil(prompt_len / page_size)
  row_pages = math.ceil((completion_len + page_size) / page_size)
  return EnginePool(
      engines=engines, prompts=held, rows=rows, batch_rows=bucket(rows, MIN_ROWS),
      page_size=page_size, prompt_pages=prompt_pages, row_pages=row_pages,
      pages=pool_pages(held * prompt_pages + rows * row_pages + 1),
      table_width=math.ceil((prompt_len + completion_len) / page_size),
      live_tokens=held * prompt_len + rows * completion_len)


def compile_decode(cfg, graphdef, abstract_state, sampler_mesh, pool: EnginePool,
                   compile_options):
  """(compiled decode step, its placed state, its placed pools) for one engine on its
  tensor devices; the pools' KV heads are split over tensor where it divides them."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  mesh = engines.shard_meshes(sampler_mesh)[0]  # the first data shard's tensor devices
  state = jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s),
                       abstract_state, sharding.state_shardings(abstract_state, mesh))
  page = jax.ShapeDtypeStruct((pool.pages, cfg.num_kv_heads, pool.page_size, cfg.head_dim),
                              cfg.jnp_dtype, sharding=programs.pool_sharding(cfg, mesh))
  pools = (tuple(page for _ in range(cfg.num_layers)),
           tuple(page for _ in range(cfg.num_layers)))
  replicated = NamedSharding(mesh, P())
  r = pool.batch_rows
  per_row = lambda dtype: jax.ShapeDtypeStruct((r,), dtype, sharding=replicated)
  table = jax.ShapeDtypeStruct((r, pool.table_width), jnp.int32, sharding=replicated)
  compiled = programs.for_graph(graphdef, mesh).decode.lower(
      state, pools, per_row(jnp.int32), table, per_row(jnp.int32), per_row(jnp.int32),
      per_row(jnp.uint32), per_row(jnp.int32), per_row(jnp.int32), per_row(jnp.float32),
      per_row(jnp.int32), per_row(jnp.float32)).compile(compile_options)
  return compiled, state, pools
