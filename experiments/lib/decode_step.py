"""A decode step of rlcode.sampling.generate against the memory-bandwidth bound: the bytes
it must read (every weight once, every row's live keys and values) over HBM bandwidth.
gpu/decode_roofline.py tables it, gpu/decode_profile.py traces its kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.lib.timing import best_time
from rlcode.models import Decoder
from rlcode.sampling import generate

TARGET = 2.5  # the claim: a step within 2.5x of its bound


def step_bytes(cfg, batch: int, prompt: int, new: int) -> dict:
  """Bytes a decode step must read, averaged over the new-1 decode steps."""
  itemsize = jnp.dtype(cfg.jnp_dtype).itemsize
  weights = cfg.num_params() * jnp.dtype(cfg.jnp_param_dtype).itemsize
  per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize
  # Decode step i (1..new-1) attends over prompt + i keys per row.
  live = np.mean([prompt + i for i in range(1, new)]) if new > 1 else prompt
  return dict(weights=int(weights), kv=int(batch * live * per_token))


def workload(cfg, *, batch: int, prompt: int, new: int):
  """(prefill, gen): thunks running the prompts' forward alone (jitted) and a greedy
  `generate` of `new` tokens, on a random-weight `cfg` model and random prompts."""
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  prompts = rng.integers(1, cfg.vocab_size, (batch, prompt))
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, tokens):
    """The prompts' forward alone: the last position's logits."""
    m = nnx.merge(graphdef, state)
    h, _ = m.hidden(tokens)
    return m.logits(h[:, -1:])

  tokens = jnp.asarray(prompts, jnp.int32)
  prefill = lambda: forward(state, tokens)
  gen = lambda: generate(model, prompts.tolist(), max_new_tokens=new, temperature=0.0).tokens
  return prefill, gen


def measure(cfg, *, batch: int, prompt: int, new: int, repeats: int, hbm: float,
            work=None) -> dict:
  """The step against its bound; `work`: a `workload(...)` pair to time (default: a new one)."""
  prefill, gen = work or workload(cfg, batch=batch, prompt=prompt, new=new)
  prefill_s = best_time(prefill, repeats)
  total_s = best_time(gen, repeats)
  step_s = (total_s - prefill_s) / max(new - 1, 1)
  need = step_bytes(cfg, batch, prompt, new)
  bound_s = (need["weights"] + need["kv"]) / hbm
  return dict(batch=batch, prompt=prompt, new_tokens=new, params=cfg.num_params(),
              generate_s=total_s, prefill_s=prefill_s, step_ms=step_s * 1e3,
              bytes_per_step=need, bound_ms=bound_s * 1e3, ratio_to_bound=step_s / bound_s,
              target=TARGET, met=0 < step_s / bound_s <= TARGET,
              tokens_per_s=batch * new / total_s)
