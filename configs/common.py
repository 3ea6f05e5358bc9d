"""Pieces the config files share (configs import this as `common`)."""

import ml_collections


def tiny_model() -> ml_collections.ConfigDict:
  """A ~1M-parameter Qwen2-style decoder over bytes, initialised from scratch."""
  model = ml_collections.ConfigDict()
  model.hf_path = ""
  # "": the checkpoint's own tokenizer when hf_path is set, else the byte-level one.
  model.tokenizer = ""
  model.param_dtype = "float32"
  model.dtype = "float32"
  model.attn_impl = "auto"
  model.arch = ml_collections.ConfigDict(dict(
      vocab_size=264, hidden_size=128, intermediate_size=352, num_layers=4,
      num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-6,
      qkv_bias=True, tie_embeddings=True, max_seq_len=512))
  return model


def optimizer(lr: float, warmup: int, decay: int, grad_clip: float = 1.0,
              weight_decay: float = 0.0) -> ml_collections.ConfigDict:
  """AdamW with linear warmup then cosine decay to 10% (rlcode.grpo.make_optimizer)."""
  return ml_collections.ConfigDict(dict(
      learning_rate=lr, warmup_steps=warmup, decay_steps=decay, end_lr_fraction=0.1,
      grad_clip=grad_clip, b1=0.9, b2=0.99, weight_decay=weight_decay))
