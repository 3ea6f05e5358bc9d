"""The decoder's blocks: RMSNorm, grouped-query attention with RoPE, the gated MLP (or a
mixture of experts: rlcode.models.moe), and the block.

Every parameter names its logical axes (`axes` metadata); rlcode.parallel.sharding maps
them to the mesh. Projection kernels keep heads as their own axis ([E, H, D] rather than
[E, H*D]) so that tensor parallelism splits whole heads. With `cfg.lora` set, the
targeted projections carry low-rank adapters (rlcode.models.lora) added to their output.
The families' differences are the config's switches (rlcode.models.config): q/k norms,
where the norms sit, Gemma's norm scale, the MLP's activation, the attention scale and
the local layers' rope.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from rlcode import kernels
from rlcode.models import lora as lora_lib
from rlcode.models import rope as rope_lib
from rlcode.models.config import ModelConfig
from rlcode.models.dense import dense
from rlcode.models.moe import MoE, activation
from rlcode.models.nsa import NSAAttention
from rlcode.models.paged import PagedLayer
from rlcode.parallel import context, sharding

_INIT_STD = 0.02  # Hugging Face's initializer_range for Qwen2 and Llama

NONCAUSAL = kernels.AttentionSpec(causal=False)
# Up to this many queries per prefix, prefix attention runs as decoding.
DECODE_QUERIES = 64


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Packed:
  """Segment ids [B, T] of sequences packed into rows (rlcode.rl.packing): every attention
  layer attends causally within a token's own sequence (kernels.PACKED), where a plain
  [B, T] array of segment ids reaches document layers only."""

  ids: jax.Array


def rope_frequencies(cfg: ModelConfig) -> jax.Array:
  return rope_lib.frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)


def rope_tables(cfg: ModelConfig, positions_bt: jax.Array):
  """What the blocks take as `rope`: one (cos, sin) table, or with local_rope_theta a dict
  of the global layers' table and the sliding layers' ("sliding")."""
  table = rope_lib.table(positions_bt, rope_frequencies(cfg),
                         rope_lib.attention_factor(cfg.rope_scaling))
  if not cfg.local_rope_theta:
    return table
  local = rope_lib.table(positions_bt, rope_lib.frequencies(cfg.head_dim, cfg.local_rope_theta))
  return {"global": table, "sliding": local}


def rope_for(rope, kind: str):
  """A layer's (cos, sin) of `rope_tables`' result."""
  if not isinstance(rope, dict):
    return rope
  return rope["sliding"] if kind == "sliding" else rope["global"]


def _param(rngs: nnx.Rngs, shape, axes, dtype, std=_INIT_STD) -> nnx.Param:
  return nnx.Param(std * jax.random.normal(rngs.params(), shape, dtype), axes=axes)


class RMSNorm(nnx.Module):
  """RMSNorm over the last axis: Llama's (w times the normalised input cast to the compute
  dtype) or, with cfg.norm_plus_one, Gemma's ((1 + w) times it, in float32, then cast)."""

  def __init__(self, dim: int, eps: float, cfg: ModelConfig):
    self.eps = eps
    self.dtype = cfg.jnp_dtype
    self.plus_one = cfg.norm_plus_one
    init = jnp.zeros if self.plus_one else jnp.ones
    self.scale = nnx.Param(init((dim,), cfg.jnp_base_dtype), axes=(None,))

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    if self.plus_one:
      return (y * (1.0 + self.scale[...].astype(jnp.float32))).astype(self.dtype)
    return self.scale[...].astype(self.dtype) * y.astype(self.dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE.

  The q, k and v projections are one parameter `qkv` [E, K, G + 2, D], grouped
  by KV head: for KV head k, slots 0..G-1 are its G query heads (query head
  k * G + g, the Hugging Face order), slot G its key and slot G + 1 its value.
  One matmul computes all three, and tensor parallelism over kv_heads keeps
  each group's queries with their key and value.
  """

  def __init__(self, cfg: ModelConfig, spec: kernels.AttentionSpec, *, rngs: nnx.Rngs,
               adapter_rngs: nnx.Rngs | None = None):
    e, h, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = h // k
    pd = cfg.jnp_base_dtype
    self.cfg, self.spec = cfg, spec
    self.qkv = _param(rngs, (e, k, g + 2, d), ("embed", "kv_heads", None, "head_dim"), pd)
    self.o = _param(rngs, (h, d, e), ("heads", "head_dim", "embed"), pd)
    if cfg.qkv_bias:
      self.qkv_bias = nnx.Param(jnp.zeros((k, g + 2, d), pd), axes=("kv_heads", None, "head_dim"))
    if cfg.qk_norm != "none":
      full = cfg.qk_norm == "full"
      self.q_norm = RMSNorm(h * d if full else d, cfg.rms_norm_eps, cfg)
      self.k_norm = RMSNorm(k * d if full else d, cfg.rms_norm_eps, cfg)
    lora = cfg.lora
    targets = () if lora is None else lora.targets
    adapter = lambda *shapes: lora_lib.Adapter(lora, *shapes, cfg.jnp_param_dtype,
                                               rngs=adapter_rngs or rngs)
    if "q" in targets:
      self.lora_q = adapter((e,), ("embed",), (k, g, d), ("kv_heads", None, "head_dim"))
    if "k" in targets:
      self.lora_k = adapter((e,), ("embed",), (k, d), ("kv_heads", "head_dim"))
    if "v" in targets:
      self.lora_v = adapter((e,), ("embed",), (k, d), ("kv_heads", "head_dim"))
    if "o" in targets:
      self.lora_o = adapter((h, d), ("heads", "head_dim"), (e,), ("embed",))

  def _delta(self, name: str, x, y):
    """y plus the adapter `name`'s delta of x, if the layer has that adapter."""
    adapter = getattr(self, "lora_" + name, None)
    if adapter is None:
      return y
    return y + adapter(x, self.cfg.jnp_dtype, lora_lib.TARGETS.index(name))

  def project_qkv(self, x_btd, rope):
    cfg = self.cfg
    dt = cfg.jnp_dtype
    g = cfg.num_heads // cfg.num_kv_heads
    qkv = dense(x_btd, self.qkv[...].astype(dt))  # [B, T, K, G + 2, D]
    if cfg.qkv_bias:
      qkv = qkv + self.qkv_bias[...].astype(dt)
    b, t = x_btd.shape[:2]
    q = self._delta("q", x_btd, qkv[:, :, :, :g]).reshape(b, t, cfg.num_heads, cfg.head_dim)
    k = self._delta("k", x_btd, qkv[:, :, :, g])
    if cfg.qk_norm == "head":
      q, k = self.q_norm(q), self.k_norm(k)
    elif cfg.qk_norm == "full":
      q = self.q_norm(q.reshape(b, t, -1)).reshape(q.shape)
      k = self.k_norm(k.reshape(b, t, -1)).reshape(k.shape)
    q = rope_lib.apply(q, rope)
    if cfg.query_scale:  # the kernels scale by D ** -0.5; Gemma's is query_scale ** -0.5
      q = q * jnp.asarray((cfg.head_dim / cfg.query_scale) ** 0.5, q.dtype)
    q = sharding.constrain(q, ("batch", "length", "heads", "head_dim"))
    k = sharding.constrain(rope_lib.apply(k, rope), ("batch", "length", "kv_heads", "head_dim"))
    v = sharding.constrain(self._delta("v", x_btd, qkv[:, :, :, g + 1]),
                           ("batch", "length", "kv_heads", "head_dim"))
    return q, k, v

  def output(self, attn_bthd):
    y = dense(attn_bthd, self.o[...].astype(self.cfg.jnp_dtype), contract=2)
    return sharding.constrain(self._delta("o", attn_bthd, y), ("batch", "length", "embed"))

  def merge_lora(self) -> None:
    """Folds the adapters into qkv and o, and drops them (in place)."""
    g = self.cfg.num_heads // self.cfg.num_kv_heads
    qkv = self.qkv[...].astype(jnp.float32)
    for name, slot in (("q", slice(0, g)), ("k", g), ("v", g + 1)):
      adapter = getattr(self, "lora_" + name, None)
      if adapter is not None:
        qkv = qkv.at[:, :, slot].add(adapter.delta_weight())
        delattr(self, "lora_" + name)
    self.qkv[...] = qkv.astype(self.qkv[...].dtype)
    if getattr(self, "lora_o", None) is not None:
      self.o[...] = (self.o[...].astype(jnp.float32)
                     + self.lora_o.delta_weight()).astype(self.o[...].dtype)
      del self.lora_o

  def __call__(self, x_btd, rope, *, cache_kv=None, cache_lengths=None, prefix_kv=None,
               segment_ids=None):
    """Self-attention over x, or (with a cache) over the cache plus x; with a
    prefix, also over the row's shared prefix. segment_ids [B, T] mark the
    packed documents of a document layer.

    Returns the output and the layer's keys/values: those of x alone
    [B, T, K, D] without a cache (the prefill's), the updated cache otherwise.
    The prefix (k, v, lengths) is read, never written.
    """
    q, k, v = self.project_qkv(x_btd, rope)
    impl = self.cfg.attn_impl
    if isinstance(cache_kv, PagedLayer):
      if prefix_kv is not None:
        raise ValueError("a paged cache shares prompts by its page table, not a prefix")
      new_kv = cache_kv.write(k, v, cache_lengths)
      own = kernels.paged_attention(q, new_kv.k, new_kv.v, new_kv.page_table,
                                    cache_lengths + new_kv.valid, spec=self.spec, impl=impl,
                                    q_offset=cache_lengths)
      return self.output(own), new_kv
    if cache_kv is None:
      # A document layer given no segment ids sees one document: plain causal.
      spec = (kernels.DENSE_CAUSAL if self.spec.kind == "document" and segment_ids is None
              else self.spec)
      if isinstance(segment_ids, Packed):
        spec, segment_ids = kernels.PACKED, segment_ids.ids
      lse = prefix_kv is not None
      own = context.self_attention(
          lambda q, k, v, q_offset, seg, kv_seg: kernels.attention(
              q, k, v, spec, impl=impl, segment_ids=seg, kv_segment_ids=kv_seg,
              q_offset=q_offset, return_lse=lse),
          q, k, v, segment_ids, return_lse=lse)
      new_kv = (k, v)
    else:
      k_cache, v_cache = cache_kv
      write = jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (0, i, 0)))
      new_kv = (write(k_cache, k.swapaxes(1, 2).astype(k_cache.dtype), cache_lengths),
                write(v_cache, v.swapaxes(1, 2).astype(v_cache.dtype), cache_lengths))
      own = kernels.decode_attention(q, *new_kv, cache_lengths + q.shape[1], spec=self.spec,
                                     impl=impl, return_lse=prefix_kv is not None,
                                     kv_head_major=True)
    if prefix_kv is None:
      return self.output(own), new_kv
    own_start = jnp.zeros((q.shape[0],), jnp.int32) if cache_lengths is None else cache_lengths
    k_pre, v_pre, lengths, head_major = prefix_kv
    attend = lambda q, start, k, v, n: self._prefix_attention(q, start, k, v, n, head_major)
    if cache_kv is None:
      shared = context.prefix_attention(attend, q, own_start, k_pre, v_pre, lengths, head_major)
    else:
      shared = attend(q, own_start, k_pre, v_pre, lengths)
    out, _ = kernels.merge(*zip(own, shared))
    return self.output(out), new_kv

  def _prefix_attention(self, q_nthd, own_start_n, k_pre, v_pre, lengths_p, head_major):
    """Attention of each row's queries over its group's prefix (Hydragen).

    Dense layers: the G rows of a group are one block of G*T queries against
    the one stored copy of their prefix: every query sees the whole prefix (it
    precedes them all), so the block is non-causal and the prefix is never
    repeated. A block of a few queries (decoding) goes through the decode
    kernel. Sliding layers see only the prefix's last window-1 keys, which
    each row takes for itself (a window, not the prompt); own_start_n [N] is
    how many of the row's own tokens precede its first query (its cache).
    """
    n, t, h, d = q_nthd.shape
    p = lengths_p.shape[0]
    impl = self.cfg.attn_impl
    if self.spec.kind == "sliding":
      return self._prefix_window(q_nthd, own_start_n, k_pre, v_pre, lengths_p, head_major)
    if self.spec.kind not in ("dense", "document") or not self.spec.causal:
      raise NotImplementedError(f"a shared prefix is not implemented for {self.spec}")
    q = q_nthd.reshape(p, (n // p) * t, h, d)
    if head_major or (n // p) * t <= DECODE_QUERIES:
      out, lse = kernels.decode_attention(
          q, k_pre, v_pre, lengths_p, spec=NONCAUSAL, impl=impl, return_lse=True,
          q_offset=lengths_p, kv_head_major=head_major)
    else:
      out, lse = kernels.attention(q, k_pre, v_pre, NONCAUSAL, impl=impl,
                                   kv_lengths=lengths_p, return_lse=True)
    return out.reshape(n, t, h, d), lse.reshape(n, t, h)

  def _prefix_window(self, q_nthd, own_start_n, k_pre, v_pre, lengths_p, head_major):
    n, t, h, _ = q_nthd.shape
    p = lengths_p.shape[0]
    seq_axis = 2 if head_major else 1
    take = min(self.spec.window - 1, k_pre.shape[seq_axis])
    if take == 0:  # a window of one token never reaches back into the prefix
      return jnp.zeros_like(q_nthd), jnp.full((n, t, h), -jnp.inf, jnp.float32)
    start = jnp.maximum(lengths_p - take, 0)
    cut = jax.vmap(lambda x, s: jax.lax.dynamic_slice_in_dim(x, s, take, seq_axis - 1))
    k_tail, v_tail = cut(k_pre, start), cut(v_pre, start)
    if head_major:
      k_tail, v_tail = k_tail.swapaxes(1, 2), v_tail.swapaxes(1, 2)
    rows = lambda x: jnp.repeat(x, n // p, axis=0)
    # Row r's first query follows its prefix and its own earlier tokens.
    offset = rows(lengths_p - start) + own_start_n
    return kernels.attention(q_nthd, rows(k_tail), rows(v_tail), self.spec,
                             impl=self.cfg.attn_impl, q_offset=offset,
                             kv_lengths=rows(lengths_p - start), return_lse=True)


class MLP(nnx.Module):
  """The gated MLP: down(act(gate(x)) * up(x)) (SwiGLU, or GeGLU with cfg.mlp_act), gate and
  up as one parameter [E, 2, F] (F: cfg.intermediate_size unless `width` says)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, adapter_rngs: nnx.Rngs | None = None,
               width: int | None = None, adapters: bool = True):
    e, f, pd = cfg.hidden_size, width or cfg.intermediate_size, cfg.jnp_base_dtype
    self.dtype = cfg.jnp_dtype
    self.act = cfg.mlp_act
    self.gate_up = _param(rngs, (e, 2, f), ("embed", None, "mlp"), pd)
    self.down = _param(rngs, (f, e), ("mlp", "embed"), pd)
    targets = () if cfg.lora is None or not adapters else cfg.lora.targets
    adapter = lambda *shapes: lora_lib.Adapter(cfg.lora, *shapes, cfg.jnp_param_dtype,
                                               rngs=adapter_rngs or rngs)
    for name in ("gate", "up"):
      if name in targets:
        setattr(self, "lora_" + name, adapter((e,), ("embed",), (f,), ("mlp",)))
    if "down" in targets:
      self.lora_down = adapter((f,), ("mlp",), (e,), ("embed",))

  def _delta(self, name: str, x, y):
    adapter = getattr(self, "lora_" + name, None)
    if adapter is None:
      return y
    return y + adapter(x, self.dtype, lora_lib.TARGETS.index(name))

  def __call__(self, x_btd):
    dt = self.dtype
    gu = dense(x_btd, self.gate_up[...].astype(dt))
    gate, up = self._delta("gate", x_btd, gu[..., 0, :]), self._delta("up", x_btd, gu[..., 1, :])
    h = sharding.constrain(activation(self.act)(gate) * up, ("batch", "length", "mlp"))
    return sharding.constrain(self._delta("down", h, dense(h, self.down[...].astype(dt))),
                              ("batch", "length", "embed"))

  def merge_lora(self) -> None:
    gate_up = self.gate_up[...].astype(jnp.float32)
    for name, slot in (("gate", 0), ("up", 1)):
      adapter = getattr(self, "lora_" + name, None)
      if adapter is not None:
        gate_up = gate_up.at[:, slot].add(adapter.delta_weight())
        delattr(self, "lora_" + name)
    self.gate_up[...] = gate_up.astype(self.gate_up[...].dtype)
    if getattr(self, "lora_down", None) is not None:
      self.down[...] = (self.down[...].astype(jnp.float32)
                        + self.lora_down.delta_weight()).astype(self.down[...].dtype)
      del self.lora_down


def attention_spec(cfg: ModelConfig, kind: str) -> kernels.AttentionSpec:
  if kind == "sliding":
    return kernels.AttentionSpec(kind="sliding", window=cfg.sliding_window)
  return kernels.AttentionSpec(kind=kind)


class Block(nnx.Module):
  """Attention of the layer's kind and the MLP (a mixture of experts in an MoE layer), each
  with its residual and its norms where cfg.norm_layout puts them: "pre" norms the
  sublayer's input, "post" its output, "sandwich" both."""

  def __init__(self, cfg: ModelConfig, kind: str, *, rngs: nnx.Rngs,
               adapter_rngs: nnx.Rngs | None = None, moe: bool = False):
    self.kind, self.layout = kind, cfg.norm_layout
    norm = lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg)
    if self.layout != "post":
      self.attn_norm = norm()
    if kind == "nsa":
      self.attn = NSAAttention(
          hidden_size=cfg.hidden_size, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
          head_dim=cfg.head_dim, nsa=cfg.nsa, qkv_bias=cfg.qkv_bias,
          param_dtype=cfg.jnp_base_dtype, dtype=cfg.jnp_dtype, impl=cfg.attn_impl, rngs=rngs)
    else:
      self.attn = Attention(cfg, attention_spec(cfg, kind), rngs=rngs,
                            adapter_rngs=adapter_rngs)
    if self.layout != "pre":
      self.attn_post_norm = norm()
    if self.layout != "post":
      self.mlp_norm = norm()
    if moe:
      # LoRA adapts attention only in MoE layers: the experts (shared one included) stay
      # frozen, so a PEFT export holds every adapter there is.
      shared = (MLP(cfg, rngs=rngs, width=cfg.moe.shared_intermediate_size, adapters=False)
                if cfg.moe.shared_intermediate_size else None)
      self.mlp = MoE(cfg, rngs=rngs, shared_mlp=shared)
    else:
      self.mlp = MLP(cfg, rngs=rngs, adapter_rngs=adapter_rngs)
    if self.layout != "pre":
      self.mlp_post_norm = norm()

  def __call__(self, x, rope, *, segment_ids=None, cache_kv=None,
               cache_lengths=None, prefix_kv=None, experts=None):
    """(x, kv, aux): the block's output, its keys/values (as Attention returns them) and
    the MoE router's statistics and chosen experts ({} for a plain MLP). experts [B, T,
    k]: an MoE layer replays this choice (rlcode.models.moe.route)."""
    rope = rope_for(rope, self.kind)
    h = x if self.layout == "post" else self.attn_norm(x)
    if self.kind == "nsa":
      if prefix_kv is not None:
        raise NotImplementedError("NSA layers do not take a shared prefix (a prompt's "
                                  "compressed tokens and selection are per row); sample "
                                  "NSA models with share_prompt=False")
      if cache_kv is None:
        a, state = self.attn(h, rope)
      else:
        a, state = self.attn.decode(h, rope, cache_kv[0], cache_lengths)
      kv = (state, None)
    else:
      if isinstance(segment_ids, Packed) and self.kind != "dense":
        raise NotImplementedError(f"packed sequences need dense attention layers, and this "
                                  f"model has {self.kind!r} layers")
      own = isinstance(segment_ids, Packed) or self.kind == "document"
      a, kv = self.attn(h, rope, cache_kv=cache_kv, cache_lengths=cache_lengths,
                        prefix_kv=prefix_kv, segment_ids=segment_ids if own else None)
    if self.layout != "pre":
      a = self.attn_post_norm(a)
    x = x + a
    h = x if self.layout == "post" else self.mlp_norm(x)
    aux = {}
    if isinstance(self.mlp, MoE):
      m, aux = self.mlp(h, experts)
    else:
      m = self.mlp(h)
    if self.layout != "pre":
      m = self.mlp_post_norm(m)
    return x + m, kv, aux

  def merge_lora(self) -> None:
    """Folds the block's adapters into its weights, in place (NSA attention and MoE MLPs
    have none)."""
    if isinstance(self.attn, Attention):
      self.attn.merge_lora()
    if isinstance(self.mlp, MLP):
      self.mlp.merge_lora()
