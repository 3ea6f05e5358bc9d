"""Generation from the policy: prefill and a compiled decode loop, and KV stores.

  generation.py  `generate` (through the engine); `static_generate`, `prefill`, `decode`:
                 the static loop (NSA models, host-offloaded KV, the engine's baseline)
  engines.py     a batch of prompts over one rlcode.engine.Engine per data shard
  doc_store.py   per-document KV for document ("squid") attention, composed at query time
  job.py         `rlcode sample`: completions of a config's prompts to JSON lines
"""

from rlcode.sampling.generation import (MIN_PROMPT_BUCKET, Generation, bucket, decode, generate,
                                        prefill, row_keys, sample_logits, static_generate)

__all__ = ["MIN_PROMPT_BUCKET", "Generation", "bucket", "decode", "generate", "prefill",
           "row_keys", "sample_logits", "static_generate"]
