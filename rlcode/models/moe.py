"""Mixture-of-experts MLPs: top-k routing, grouped matmuls, expert parallelism.

A router (a linear map to X logits, softmax in float32) picks top_k experts per token
(Qwen3-MoE renormalises their probabilities, Qwen2-MoE does not). The (token, expert)
assignments are sorted by expert, so each expert's rows are contiguous, and the experts'
SwiGLU runs as two grouped matmuls over them (`grouped_matmul`): no dense loop over
experts and no capacity: every assignment is computed (dropless), so no token is dropped
and `dropped` is not a statistic here. A Qwen2-MoE shared expert runs on every token,
gated by a sigmoid of its own one-output router.

Expert parallelism: under a mesh whose `expert` axis has E_p > 1 devices, the routed
experts are split over it (logical axis `experts`) and the layer runs in a shard_map:
each device routes its own tokens, the tokens and their routing are all-gathered over
`expert`, each device computes its X / E_p experts' assignments among them, and the
outputs are reduce-scattered back to the tokens' devices (the backward pass is the same
two collectives transposed). Gathering every token to every expert device sends E_p / k
times the rows an all-to-all of only the routed ones would (k the top_k); it needs no
ragged collective and no capacity, and each device's work is its experts' rows. Within
the layer the experts' width is split over `tensor` (the down projection's partial sums
added by a psum).

Router statistics (each expert's share of the assignments, the router's mean entropy,
the Switch load-balancing loss X * sum_e f_e P_e) come back with the output, averaged
over all tokens the call saw (padding included), for the trainer to log and, when
MoEConfig.aux_loss_weight > 0, to add to its loss. This module knows no loss.

Routing replay (the sampler's choice of experts reused by the update, so that the
trainer's router picking other experts for the same tokens cannot blow up the importance
ratios): each layer also returns the experts it chose ([B, T, k], `collect_experts`
gathers them per forward), and takes a choice to replay instead (`route`), whose gate
weights come from the current router, so the router still learns.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from rlcode.kernels.spec import cdiv
from rlcode.models.config import ModelConfig, MoEConfig
from rlcode.models.dense import dense
from rlcode.parallel import sharding

AXIS = "expert"
_INIT_STD = 0.02


def activation(name: str):
  return jax.nn.silu if name == "silu" else (lambda x: jax.nn.gelu(x, approximate=True))


# ------------------------------------------------------------------ grouped matmuls

def grouped_matmul(x_mk: jax.Array, w_gkn: jax.Array, sizes_g: jax.Array, impl: str,
                   tile: int = 64) -> jax.Array:
  """Rows of x in contiguous groups (group g: the next sizes_g[g] rows) times w[g].

  x [M, K], w [G, K, N], sizes [G] int32 summing to at most M; rows past the sum come
  back as zeros. impl: "ragged" (jax.lax.ragged_dot), "tiled" (`tiled_matmul`), "dense"
  (every group on every row, masked: the reference).
  """
  if impl == "ragged":
    return jax.lax.ragged_dot(x_mk, w_gkn, sizes_g)
  if impl == "tiled":
    return tiled_matmul(x_mk, w_gkn, sizes_g, tile)
  if impl != "dense":
    raise ValueError(f"grouped_matmul impl={impl!r}; expected ragged, tiled or dense")
  group = _group_of_rows(sizes_g, x_mk.shape[0])
  out = jnp.zeros((x_mk.shape[0], w_gkn.shape[2]), jnp.result_type(x_mk, w_gkn))
  for g in range(w_gkn.shape[0]):
    out = out + jnp.where((group == g)[:, None], x_mk @ w_gkn[g], 0)
  return out


def _group_of_rows(sizes_g: jax.Array, m: int) -> jax.Array:
  """[M]: each row's group (G for rows past the sum of sizes)."""
  return jnp.searchsorted(jnp.cumsum(sizes_g), jnp.arange(m, dtype=jnp.int32), side="right")


def tiled_matmul(x_mk: jax.Array, w_gkn: jax.Array, sizes_g: jax.Array, tile: int) -> jax.Array:
  """The grouped matmul as a scan of [tile, K] x [K, N] matmuls: each group's rows are
  moved to whole tiles of their own (at most G partly empty ones more than M / tile), and
  each tile is multiplied by its group's weight. Costs (M + G * tile) * K * N, where a
  ragged_dot XLA:CPU lowers to every group on every row costs G * M * K * N."""
  m, g = x_mk.shape[0], w_gkn.shape[0]
  tiles = cdiv(m, tile) + g
  padded = cdiv(sizes_g, tile) * tile
  padded_end = jnp.cumsum(padded)
  group = _group_of_rows(sizes_g, m)
  valid = group < g
  safe = jnp.minimum(group, g - 1)
  first_row = jnp.cumsum(sizes_g) - sizes_g
  dest = jnp.where(valid, padded_end[safe] - padded[safe] + jnp.arange(m) - first_row[safe],
                   tiles * tile)
  xp = jnp.zeros((tiles * tile, x_mk.shape[1]), x_mk.dtype).at[dest].set(x_mk, mode="drop")
  tile_group = jnp.minimum(jnp.searchsorted(padded_end, jnp.arange(tiles) * tile,
                                            side="right"), g - 1)

  # Rematerialised: the backward pass slices a tile's weight again instead of keeping
  # every tile's [K, N] slice alive (tiles x K x N: more than the experts themselves).
  @jax.checkpoint
  def one(_, xs):
    x_t, e = xs
    return None, x_t @ w_gkn[e]

  _, y = jax.lax.scan(one, None, (xp.reshape(tiles, tile, -1), tile_group))
  return y.reshape(tiles * tile, -1).at[dest].get(mode="fill", fill_value=0)


def resolved_impl(moe: MoEConfig) -> str:
  if moe.impl != "auto":
    return moe.impl
  return "tiled" if jax.default_backend() == "cpu" else "ragged"


# ------------------------------------------------------------------ routing and experts

def route(x_nd: jax.Array, router_dx: jax.Array, moe: MoEConfig,
          replay_nk: jax.Array | None = None):
  """(expert ids [N, k] int32, weights [N, k] in x's dtype, probabilities [N, X] f32).

  replay_nk [N, k] int32 (routing replay): a token whose k ids are all in [0, X) uses
  those experts instead of its top k, weighted by the current router's probabilities at
  them (renormalised when the config renormalises the top k), so the router still gets
  gradients; a token with an id out of range (-1: not recorded, padding) is routed. None:
  every token is routed, exactly as without replay."""
  logits = dense(x_nd, router_dx.astype(x_nd.dtype)).astype(jnp.float32)
  probs = jax.nn.softmax(logits, axis=-1)
  top_p, top_i = jax.lax.top_k(probs, moe.top_k)
  top_i = top_i.astype(jnp.int32)
  if replay_nk is not None:
    replay_nk = replay_nk.astype(jnp.int32)
    use = jnp.all((replay_nk >= 0) & (replay_nk < moe.num_experts), axis=-1, keepdims=True)
    ids = jnp.clip(replay_nk, 0, moe.num_experts - 1)
    top_i = jnp.where(use, ids, top_i)
    top_p = jnp.where(use, jnp.take_along_axis(probs, ids, axis=-1), top_p)
  if moe.norm_topk_prob:
    top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
  return top_i, top_p.astype(x_nd.dtype), probs


def expert_outputs(x_nd, top_i, weights, w_gate_up, w_down, first, act, impl, tile):
  """sum_j weights[n, j] * expert_{top_i[n, j]}(x_n) over the experts this device holds
  (ids first .. first + X_local - 1), [N, E]; other experts contribute zero."""
  n, k = top_i.shape
  local_x, e = w_gate_up.shape[0], x_nd.shape[1]
  f = w_gate_up.shape[-1]
  ids = top_i.reshape(-1) - first
  mine = (ids >= 0) & (ids < local_x)
  key = jnp.where(mine, ids, local_x)
  order = jnp.argsort(key, stable=True)
  sizes = jnp.zeros((local_x + 1,), jnp.int32).at[key].add(1)[:local_x]
  token = order // k
  rows = x_nd[token]
  h = grouped_matmul(rows, w_gate_up.reshape(local_x, e, 2 * f), sizes, impl, tile)
  h = h.reshape(-1, 2, f)
  out = grouped_matmul(act(h[:, 0]) * h[:, 1], w_down, sizes, impl, tile)
  scale = jnp.where(mine, weights.reshape(-1), 0)[order]
  out = out * scale[:, None].astype(out.dtype)
  return jnp.zeros((n, e), out.dtype).at[token].add(out)


def router_stats(top_i, probs, num_experts: int) -> dict[str, jax.Array]:
  """Sums over the tokens: assignments per expert, router probability per expert, router
  entropy, tokens (divided by the count in `finish`, after any cross-device or
  cross-layer sum)."""
  assigned = jnp.zeros((num_experts,), jnp.float32).at[top_i.reshape(-1)].add(1.0)
  entropy = -jnp.sum(probs * jnp.log(jnp.maximum(probs, 1e-30)), axis=-1)
  return dict(assigned=assigned, prob=jnp.sum(probs, axis=0), entropy=jnp.sum(entropy),
              tokens=jnp.float32(top_i.shape[0]))


def with_balance_loss(sums: dict[str, jax.Array], top_k: int) -> dict[str, jax.Array]:
  """`sums` of one layer plus its Switch load-balancing loss X * sum_e f_e P_e (f_e the
  expert's share of the assignments, P_e its mean router probability), token-weighted so
  that layers and forwards add up."""
  tokens = jnp.maximum(sums["tokens"], 1.0)
  share = sums["assigned"] / (tokens * top_k)
  balance = share.shape[0] * jnp.sum(share * sums["prob"] / tokens)
  return dict(sums, balance=balance * sums["tokens"])


def finish(sums: dict[str, jax.Array], top_k: int) -> dict[str, jax.Array]:
  """Per-token averages of summed statistics: each expert's load (its share of the
  assignments), the router's entropy and the load-balancing loss."""
  tokens = jnp.maximum(sums["tokens"], 1.0)
  return dict(load=sums["assigned"] / (tokens * top_k), entropy=sums["entropy"] / tokens,
              aux_loss=sums["balance"] / tokens)


class MoE(nnx.Module):
  """The routed experts (and a shared expert if the family has one) of one layer."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, shared_mlp=None):
    moe = cfg.moe
    e, x, f, pd = cfg.hidden_size, moe.num_experts, moe.intermediate_size, cfg.jnp_base_dtype
    self.cfg, self.moe = cfg, moe
    normal = lambda shape: _INIT_STD * jax.random.normal(rngs.params(), shape, pd)
    self.router = nnx.Param(normal((e, x)), axes=("embed", None))
    self.experts_gate_up = nnx.Param(normal((x, e, 2, f)),
                                     axes=("experts", "embed", None, "mlp"))
    self.experts_down = nnx.Param(normal((x, f, e)), axes=("experts", "mlp", "embed"))
    self.shared = shared_mlp
    if shared_mlp is not None:
      self.shared_gate = nnx.Param(normal((e, 1)), axes=("embed", None))

  def __call__(self, x_btd, replay_btk=None):
    """(output [B, T, E], router statistics and `experts`: the chosen ids [B, T, k]).

    replay_btk [B, T, k] int32: routing replay (`route`'s replay_nk); None: routed."""
    cfg, moe = self.cfg, self.moe
    dt = cfg.jnp_dtype
    act = activation(cfg.mlp_act)
    impl = resolved_impl(moe)
    w_gu = self.experts_gate_up[...].astype(dt)
    w_down = self.experts_down[...].astype(dt)
    router = self.router[...]

    def local(x_btd, router, w_gu, w_down, replay_btk=None, split_experts=False,
              gather=False, split_f=False, reduce_axes=()):
      """The layer on one device's tokens and experts. split_experts: this device holds
      experts [i * X_local, (i + 1) * X_local) of the `expert` axis's i-th device; gather:
      the tokens are split over `expert` too, so they are gathered first and the outputs
      reduce-scattered back (else the outputs are summed over `expert`)."""
      b, t, e = x_btd.shape
      x_nd = x_btd.reshape(b * t, e)
      replay = None if replay_btk is None else replay_btk.reshape(b * t, -1)
      top_i, weights, probs = route(x_nd, router, moe, replay)
      sums = router_stats(top_i, probs, moe.num_experts)
      chosen = top_i.reshape(b, t, -1)
      first = jax.lax.axis_index(AXIS) * w_gu.shape[0] if split_experts else 0
      if gather:
        x_nd, top_i, weights = (jax.lax.all_gather(a, AXIS, axis=0, tiled=True)
                                for a in (x_nd, top_i, weights))
      out = expert_outputs(x_nd, top_i, weights, w_gu, w_down, first, act, impl, moe.tile)
      if split_f:
        out = jax.lax.psum(out, "tensor")
      if gather:
        out = jax.lax.psum_scatter(out, AXIS, scatter_dimension=0, tiled=True)
      elif split_experts:
        out = jax.lax.psum(out, AXIS)
      if reduce_axes:
        sums = jax.lax.psum(sums, reduce_axes)
      return out.reshape(b, t, e), sums, chosen

    mesh = sharding.active_mesh()
    if mesh is None or all(size == 1 for size in dict(mesh.shape).values()):
      out, sums, chosen = local(x_btd, router, w_gu, w_down, replay_btk)
    else:
      out, sums, chosen = self._sharded(local, mesh, x_btd, router, w_gu, w_down, replay_btk)
    out = out.astype(dt)
    if self.shared is not None:
      gate = jax.nn.sigmoid(dense(x_btd, self.shared_gate[...].astype(dt)))
      out = out + gate * self.shared(x_btd)
    return (sharding.constrain(out, ("batch", "length", "embed")),
            dict(with_balance_loss(sums, moe.top_k), experts=chosen))

  def _sharded(self, local, mesh, x_btd, router, w_gu, w_down, replay_btk=None):
    """`local` in a shard_map: tokens as the mesh splits them, experts over `expert`,
    their width over `tensor`."""
    shape = dict(mesh.shape)
    # Each device routes whole tokens: the embedding is never split here, also where the
    # batch does not divide its axes and an activation's rules would give them to "embed".
    x_spec = sharding.logical_to_spec(("batch", "length", None), x_btd.shape, mesh=mesh,
                                      what="moe tokens")
    token_axes = [a for entry in x_spec if entry is not None
                  for a in (entry if isinstance(entry, tuple) else (entry,))]
    ep = shape.get(AXIS, 1)
    experts = AXIS if ep > 1 and w_gu.shape[0] % ep == 0 else None
    split_f = shape.get("tensor", 1) > 1 and w_gu.shape[-1] % shape["tensor"] == 0
    tensor = "tensor" if split_f else None
    options = dict(split_experts=experts is not None,
                   gather=experts is not None and AXIS in token_axes, split_f=split_f,
                   reduce_axes=tuple(token_axes))
    k_spec = P(x_spec[0], x_spec[1], None)  # [B, T, k] ids split as the tokens are
    in_specs = (x_spec, P(), P(experts, None, None, tensor), P(experts, tensor, None))
    args = (x_btd, router, w_gu, w_down)
    if replay_btk is None:
      fn = lambda x, r, wg, wd: local(x, r, wg, wd, **options)
    else:
      fn = lambda x, r, wg, wd, ids: local(x, r, wg, wd, ids, **options)
      in_specs, args = in_specs + (k_spec,), args + (replay_btk,)
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=(x_spec, P(), k_spec),
                         check_vma=False)(*args)


# ------------------------------------------------------------------ statistics out

_COLLECTED: contextvars.ContextVar = contextvars.ContextVar("rlcode_moe_stats", default=None)


@contextlib.contextmanager
def _collecting(var: contextvars.ContextVar):
  """A list that `record` appends to while the block runs (`var` names which)."""
  box: list = []
  token = var.set(box)
  try:
    yield box
  finally:
    var.reset(token)


def collect():
  """Inside the block, each decoder forward appends its router statistics (`record`) to
  the yielded list: values of the trace that computed them, to be read in that same trace
  (the trainer's loss function wraps its forward in it)."""
  return _collecting(_COLLECTED)


def record(cfg: ModelConfig, per_layer: list[dict]) -> None:
  """A forward's statistics, summed over its MoE layers, for `collect`, and its chosen
  experts, stacked over its MoE layers, for `collect_experts`."""
  layers = [aux for aux in per_layer if aux]
  if cfg.moe is None or not layers:
    return
  box = _COLLECTED.get()
  if box is not None:
    stats = [{k: v for k, v in aux.items() if k != "experts"} for aux in layers]
    box.append(jax.tree.map(lambda *xs: sum(xs), *stats))
  chosen = _EXPERTS.get()
  if chosen is not None:
    chosen.append(jnp.stack([aux["experts"] for aux in layers], axis=2))


# ------------------------------------------------------------------ routing replay

_EXPERTS: contextvars.ContextVar = contextvars.ContextVar("rlcode_moe_experts", default=None)


def collect_experts():
  """Inside the block, each decoder forward appends the experts its MoE layers chose for
  its tokens, [B, T, moe layers, top_k] int32 (layers in order), to the yielded list:
  values of the trace that computed them (as `collect`). What routing replay records."""
  return _collecting(_EXPERTS)


def moe_layer_index(cfg: ModelConfig) -> dict[int, int]:
  """{layer index: its index among the MoE layers} of the MoE layers."""
  moe_layers = [i for i in range(cfg.num_layers) if cfg.is_moe_layer(i)]
  return {i: j for j, i in enumerate(moe_layers)}


def layer_replay(cfg: ModelConfig, experts_btlk, layer: int):
  """Layer `layer`'s part [B, T, k] of recorded experts [B, T, moe layers, k] (None for
  a dense layer or without a recording)."""
  index = moe_layer_index(cfg)
  if experts_btlk is None or layer not in index:
    return None
  if experts_btlk.shape[2] != len(index) or experts_btlk.shape[3] != cfg.moe.top_k:
    raise ValueError(f"replayed experts {tuple(experts_btlk.shape)}: expected [B, T, "
                     f"{len(index)} MoE layers, top_k={cfg.moe.top_k}]")
  return experts_btlk[:, :, index[layer]]


def router_terms(cfg: ModelConfig, collected: list[dict], share: float = 1.0):
  """(extra loss, metrics) of the forwards `collect` saw: the load-balancing loss times
  cfg.moe.aux_loss_weight, and `summary` of the statistics, both times `share` (a
  micro-batch's part of the batch). (0, {}) for a dense model."""
  if cfg.moe is None or not collected:
    return 0.0, {}
  stats = finish(jax.tree.map(lambda *xs: sum(xs), *collected), cfg.moe.top_k)
  metrics = {k: v * share for k, v in summary(stats).items()}
  return cfg.moe.aux_loss_weight * stats["aux_loss"] * share, metrics


def summary(stats: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Scalars to log: the busiest and idlest experts' loads relative to an even spread (1
  is balanced), their coefficient of variation, the router's entropy (nats) and the
  load-balancing loss."""
  load = stats["load"]
  even = load * load.shape[-1]
  return {"moe/load_max": jnp.max(even), "moe/load_min": jnp.min(even),
          "moe/load_cv": jnp.std(load) / jnp.maximum(jnp.mean(load), 1e-30),
          "moe/router_entropy": stats["entropy"], "moe/aux_loss": stats["aux_loss"]}
