"""The reward model: the policy's decoder, a pooled hidden state, a scalar head.

score(prompt, candidate) = w_out . gelu(W_state pooled + W_features f + b), where pooled is
the decoder's final hidden state at the candidate's last token (its end-of-sequence) or
the mean over the candidate's tokens, and f are optional ground-truth features of the
candidate (tests passed, diff similarity: numbers the text alone may not reveal).
Concatenating f to the pooled state before the head's first layer is the same map as the
two matrices written here; keeping them apart lets the state's matrix shard over `embed`
like the decoder while the few feature rows stay replicated. The head has no output bias:
a choice's likelihood depends only on score differences.

Every parameter names its logical axes, so rlcode.sharding shards the reward model like
the policy. This module must not know about choices files, losses or checkpoints.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from rlcode.parallel import sharding
from rlcode.models.config import ModelConfig
from rlcode.models.decoder import Decoder, dense

POOLINGS = ("last", "mean")


@dataclasses.dataclass(frozen=True)
class HeadConfig:
  """pooling: "last" (the candidate's final token) or "mean" (over its tokens);
  hidden: width of the head's hidden layer; features: names of the ground-truth features
  the model takes (empty: text only)."""

  pooling: str = "last"
  hidden: int = 64
  features: tuple[str, ...] = ()

  def __post_init__(self):
    if self.pooling not in POOLINGS:
      raise ValueError(f"rm.pooling={self.pooling!r}; expected one of {POOLINGS}")
    if self.hidden < 1:
      raise ValueError(f"rm.head_hidden must be >= 1, got {self.hidden}")


def pool(h_nle: jax.Array, start_n: jax.Array, length_n: jax.Array, pooling: str) -> jax.Array:
  """[N, E]: row n's hidden state at position length-1 ("last"), or its mean over the
  candidate's positions start..length-1 ("mean")."""
  if pooling == "last":
    return jnp.take_along_axis(h_nle, (length_n - 1)[:, None, None], axis=1)[:, 0]
  pos = jnp.arange(h_nle.shape[1], dtype=jnp.int32)[None, :]
  inside = ((pos >= start_n[:, None]) & (pos < length_n[:, None])).astype(h_nle.dtype)
  count = jnp.maximum(jnp.sum(inside, axis=1, keepdims=True), 1.0)
  return jnp.einsum("nl,nle->ne", inside, h_nle) / count


class RewardModel(nnx.Module):
  """`model(tokens [N, L], start [N], length [N], features [N, F] or None)` -> scores [N].

  Row n is a prompt followed by a candidate and an end-of-sequence token; start[n] is the
  candidate's first position and length[n] the row's token count (right padding after).
  """

  def __init__(self, cfg: ModelConfig, head: HeadConfig, *, rngs: nnx.Rngs):
    self.backbone = Decoder(cfg, rngs=rngs)
    self.head = head
    e, h, pd = cfg.hidden_size, head.hidden, cfg.jnp_param_dtype
    normal = lambda shape, std: std * jax.random.normal(rngs.params(), shape, pd)
    self.w_state = nnx.Param(normal((e, h), 1 / math.sqrt(e)), axes=("embed", "mlp"))
    self.b_hidden = nnx.Param(jnp.zeros((h,), pd), axes=("mlp",))
    self.w_out = nnx.Param(normal((h,), 1 / math.sqrt(h)), axes=("mlp",))
    if head.features:
      self.w_features = nnx.Param(normal((len(head.features), h), 1.0), axes=(None, "mlp"))

  def __call__(self, tokens_nl, start_n, length_n, features_nf=None) -> jax.Array:
    f = len(self.head.features)
    if f and (features_nf is None or features_nf.shape[-1] != f):
      got = None if features_nf is None else features_nf.shape
      raise ValueError(f"this reward model takes {f} features {self.head.features}, got {got}")
    h, _ = self.backbone.hidden(tokens_nl)
    pooled = sharding.constrain(pool(h, start_n, length_n, self.head.pooling).astype(jnp.float32),
                                ("batch", "embed"))
    z = dense(pooled, self.w_state[...].astype(jnp.float32)) + self.b_hidden[...]
    if f:
      z = z + dense(features_nf.astype(jnp.float32), self.w_features[...].astype(jnp.float32))
    z = sharding.constrain(jax.nn.gelu(z), ("batch", "mlp"))
    return z @ self.w_out[...].astype(jnp.float32)
