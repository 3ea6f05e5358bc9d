"""Which implementation serves a call: a pure function of what is known when tracing.

`choose` maps (requested impl, family, backend, spec, whether the caller needs
the log-sum-exp, shapes, dtype, how queries are placed) to a `Choice`: the
implementation and the reason, so that every case is testable without a GPU.
With impl="auto":

  backend    family     case                                         serves
  not gpu    any        -                                            xla (blockwise)
  gpu        attention  dense or sliding, no lse, cuDNN's dtypes,    cudnn
                        head_dim and query placement
  gpu        attention  document, or the lse is needed, or a size   pallas
                        or placement cuDNN cannot take
  gpu        decode     -                                            pallas (split-K)
  gpu        paged      -                                            pallas (page walk)
  gpu        nsa        -                                            pallas

cuDNN (through `jax.nn.dot_product_attention`) computes dense causal and
non-causal masks, sliding windows and key padding; it cannot return a
log-sum-exp we can use: its residual is rounded to the input dtype and carries
no gradient, so partial attentions that are merged (shared prefixes, KV in
chunks) stay on our kernels. Each distinct choice is logged once at debug
level on the "kernels" logger.

Must not: import an implementation or look at array values.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from rlcode.kernels.spec import AttentionSpec

IMPLS = ("auto", "reference", "xla", "pallas", "pallas_interpret", "cudnn")
FAMILIES = ("attention", "decode", "nsa", "paged")
# cuDNN's flash attention: half-precision inputs, head_dim a multiple of 8 up
# to 128 (256 from Hopper on; 128 keeps the choice independent of the GPU).
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 128

logger = logging.getLogger("kernels")
_logged: set = set()


@dataclasses.dataclass(frozen=True)
class Choice:
  """The implementation that runs and why; `fallback` marks a request that could not run here."""

  impl: str
  reason: str
  fallback: bool = False


def cudnn_gap(spec: AttentionSpec, *, needs_lse: bool, q_shape, k_shape, dtype,
              q_offset) -> str | None:
  """Why cuDNN cannot compute this attention exactly as ours, or None when it can.

  q_offset is the caller's argument: cuDNN's causal mask puts query i on key
  i (top-left), which is ours only when queries start at key 0 (q_offset 0,
  or the default S - T with T == S). An array offset is not known while
  tracing, so it never qualifies.
  """
  t, d, s = q_shape[1], q_shape[3], k_shape[1]
  if spec.kind in ("document", "packed"):
    return f"{spec.kind} masks are computed only by our kernels"
  if needs_lse:
    return ("the caller needs the log-sum-exp (cuDNN's is rounded to the input dtype "
            "and has no gradient)")
  if np.dtype(dtype).name not in CUDNN_DTYPES:
    return f"cuDNN takes {' or '.join(CUDNN_DTYPES)}, not {np.dtype(dtype).name}"
  if d % 8 or d > CUDNN_MAX_HEAD_DIM:
    return f"head_dim={d}: cuDNN takes a multiple of 8 up to {CUDNN_MAX_HEAD_DIM}"
  if t % 2 or s % 2:
    # Seen on jax 0.11.2 (H200): its cuDNN rule refuses odd lengths when a gradient is
    # taken, and whether one will be is not known here.
    return f"odd sequence lengths (T={t}, S={s}): cuDNN's training path takes even ones"
  if spec.kind == "sliding" and t > s:
    # Seen on the H200: cuDNN validates sliding windows only with max_s_q <= max_s_kv.
    return f"a sliding window with more queries than keys (T={t} > S={s})"
  if spec.causal:
    aligned = (q_offset is None and t == s) or (
        isinstance(q_offset, (int, np.integer)) and int(q_offset) == 0)
    if not aligned:
      return ("queries do not start at key 0 (a static q_offset of 0, or T == S with the "
              "default), which cuDNN's causal mask assumes")
  return None


def choose(impl: str, *, family: str, backend: str, spec: AttentionSpec | None = None,
           needs_lse: bool = False, q_shape=None, k_shape=None, dtype=None,
           q_offset=None, fn: str | None = None) -> Choice:
  """The implementation for one call.

  Args:
    impl: the requested one, from IMPLS.
    family: "attention" (masked attention), "decode", "nsa" or "paged".
    backend: jax.default_backend().
    spec, needs_lse, q_shape ([B, T, H, D]), k_shape ([B, S, K, D]), dtype,
      q_offset: the call (attention only; see `cudnn_gap`).
    fn: the public function's name, for error messages (default: family).

  Raises ValueError for an unknown impl or family, or impl="cudnn" where
  cuDNN cannot compute the call.
  """
  fn = fn or family
  if impl not in IMPLS:
    raise ValueError(f"{fn}: impl={impl!r}; expected one of {IMPLS}")
  if family not in FAMILIES:
    raise ValueError(f"{fn}: family={family!r}; expected one of {FAMILIES}")
  on_gpu = backend == "gpu"
  gap = None
  if impl in ("auto", "cudnn"):
    if family != "attention":
      gap = f"cuDNN is not used for {family}"
    else:
      gap = cudnn_gap(spec, needs_lse=needs_lse, q_shape=q_shape, k_shape=k_shape,
                      dtype=dtype, q_offset=q_offset)
  if impl == "cudnn" and gap is not None:
    raise ValueError(f"{fn}: impl='cudnn' cannot compute this call: {gap}; use impl='auto'")
  if impl == "auto":
    if not on_gpu:
      return Choice("xla", f"backend {backend!r}: the blockwise XLA version")
    if gap is None:
      return Choice("cudnn", "a mask cuDNN computes, no log-sum-exp needed")
    return Choice("pallas", gap if family == "attention" else f"{family}: our kernel")
  if impl in ("pallas", "cudnn") and not on_gpu:
    return Choice("xla", f"impl={impl!r} needs a GPU (backend is {backend!r}); "
                         f"falling back to impl='xla'", fallback=True)
  return Choice(impl, "requested")


def log_once(fn: str, choice: Choice) -> None:
  """A debug line the first time a (function, choice) is made in this process."""
  key = (fn, choice.impl, choice.reason)
  if key not in _logged:
    _logged.add(key)
    logger.debug("%s: impl=%r (%s)", fn, choice.impl, choice.reason)
