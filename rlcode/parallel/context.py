"""Context parallelism: long sequences split over the mesh's `context` axis.

Under a mesh whose `context` axis has C > 1 devices, the logical axis `length` maps to
it (sharding.DEFAULT_RULES), so every per-token computation (embedding, projections,
norms, the MLP, the output layer) runs on 1/C of each sequence with no communication.
Attention is the one place positions meet; here each device keeps its own queries and
all-gathers the keys and values along the sequence (cheap with few KV heads: a 7B Qwen2
has 4, so one layer's K and V of a 131k-token row are 0.5 GB in bfloat16 against 3.7 GB
of its hidden states), then attends with its queries' true offset, `shard * T / C`.
The backward pass turns the all-gather into a reduce-scatter of dK and dV.

It serves dense causal, sliding-window and document attention (the segment ids are
gathered with the keys), and the shared-prompt update, whose prompt (the long part) is
split the same way: a completion's queries attend to the all-gathered prompt KV. A
layer kind without an explicit rule here (NSA) is left to XLA's partitioner, which
computes the same thing with collectives of its choosing.

The gathered keys cost memory O(T) per device and attention compute is uneven (the last
shard's queries see the most keys); a ring that passes KV blocks between neighbours
would bound the first, a zigzag split the second. Neither is here yet.
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from rlcode.parallel import sharding

AXIS = "context"


def shards() -> int:
  """C, the active mesh's context axis size (1 without a mesh or that axis)."""
  mesh = sharding.active_mesh()
  return 1 if mesh is None else dict(mesh.shape).get(AXIS, 1)


def _spec(axes, shape) -> P:
  return sharding.logical_to_spec(axes, shape, mesh=sharding.active_mesh(), what="context")


def _split(spec: P, dim: int) -> bool:
  entry = spec[dim] if dim < len(spec) else None
  names = entry if isinstance(entry, tuple) else (entry,)
  return AXIS in names


def _shard_map(fn, in_specs, out_specs):
  return jax.shard_map(fn, mesh=sharding.active_mesh(), in_specs=in_specs,
                       out_specs=out_specs, check_vma=False)


def _gather(x, dim: int):
  return jax.lax.all_gather(x, AXIS, axis=dim, tiled=True)


def self_attention(attend, q, k, v, segment_ids=None, *, return_lse: bool = False):
  """attend(q, k, v, q_offset, segment_ids, kv_segment_ids) -> out, or (out, lse) with
  return_lse, computed on each device's query shard against the all-gathered keys; the
  sequence layout [B, T, heads, D] of q, k, v. The results are laid out like q."""
  if shards() == 1:
    return attend(q, k, v, None, segment_ids, None)
  q_spec = _spec(("batch", "length", "heads", "head_dim"), q.shape)
  kv_spec = _spec(("batch", "length", "kv_heads", "head_dim"), k.shape)
  seg_spec = _spec(("batch", "length"), q.shape[:2])
  if not (_split(q_spec, 1) and _split(kv_spec, 1)):  # a length C does not divide
    return attend(q, k, v, None, segment_ids, None)
  out_specs = (q_spec, P(*q_spec[:3])) if return_lse else q_spec

  def local(q, k, v, seg):
    offset = jax.lax.axis_index(AXIS) * q.shape[1]
    kv_seg = None if seg is None else _gather(seg, 1)
    return attend(q, _gather(k, 1), _gather(v, 1), offset, seg, kv_seg)

  if segment_ids is None:
    return _shard_map(lambda q, k, v: local(q, k, v, None), (q_spec, kv_spec, kv_spec),
                      out_specs)(q, k, v)
  return _shard_map(local, (q_spec, kv_spec, kv_spec, seg_spec), out_specs)(q, k, v,
                                                                             segment_ids)


def prefix_attention(attend, q, own_start, k_pre, v_pre, lengths, head_major: bool):
  """attend(q, own_start, k_pre, v_pre, lengths) -> (out, lse) of a row's queries over
  its group's prefix (rlcode.models.blocks.Attention._prefix_attention), run on each
  device's query shard against the prefix all-gathered along its length; own_start [N]
  is how many of the row's own tokens precede its first query, which on shard c is c * T
  / C more."""
  if shards() == 1:
    return attend(q, own_start, k_pre, v_pre, lengths)
  q_spec = _spec(("batch", "length", "heads", "head_dim"), q.shape)
  kv_axes = (("batch", "kv_heads", "length", "head_dim") if head_major
             else ("batch", "length", "kv_heads", "head_dim"))
  kv_spec = _spec(kv_axes, k_pre.shape)
  rows = _spec(("batch",), own_start.shape)
  prompts = _spec(("batch",), lengths.shape)
  if prompts != rows:
    raise ValueError(f"context parallelism with a shared prefix needs the prompts "
                     f"({lengths.shape[0]}) split over the batch axes as their rows are "
                     f"({own_start.shape[0]}); make the prompts a multiple of data x fsdp")
  length_dim = 2 if head_major else 1
  gather_prefix = _split(kv_spec, length_dim)
  split_queries = _split(q_spec, 1)
  lse_spec = P(*q_spec[:3])

  def local(q, own_start, k_pre, v_pre, lengths):
    if split_queries:
      own_start = own_start + jax.lax.axis_index(AXIS) * q.shape[1]
    if gather_prefix:
      k_pre, v_pre = _gather(k_pre, length_dim), _gather(v_pre, length_dim)
    return attend(q, own_start, k_pre, v_pre, lengths)

  return _shard_map(local, (q_spec, rows, kv_spec, kv_spec, prompts),
                    (q_spec, lse_spec))(q, own_start, k_pre, v_pre, lengths)
