"""Generation from the policy: prefill and a compiled decode loop, and KV stores.

  generation.py  `generate`: bucketed prefill, one `lax.while_loop` of decode steps,
                 the shared prompt's KV read by its G rows, host-offloaded KV
  doc_store.py   per-document KV for document ("squid") attention, composed at query time
  job.py         `rlcode sample`: completions of a config's prompts to JSON lines
"""

from rlcode.sampling.generation import (MIN_PROMPT_BUCKET, Generation, bucket, decode, generate,
                                        prefill, row_keys, sample_logits)

__all__ = ["MIN_PROMPT_BUCKET", "Generation", "bucket", "decode", "generate", "prefill",
           "row_keys", "sample_logits"]
