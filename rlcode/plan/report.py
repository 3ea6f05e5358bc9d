"""The table `rlcode plan` prints: memory, FLOPs, collectives and time per device.
"""

from __future__ import annotations

from collections.abc import Mapping
from rlcode.plan import hardware
from rlcode.plan import hlo


def _gb(x: float) -> str:
  return f"{x / 1e9:8.2f} GB"


def _fit(fit: Mapping) -> str:
  """The memory features a plan was made with, in words."""
  parts = [f"remat {fit.get('remat', 'none')}"]
  if fit.get("scan_layers"):
    parts.append("scanned layers")
  if fit.get("logits_chunk"):
    parts.append(f"log-probs in chunks of {fit['logits_chunk']} positions")
  if fit.get("micro_batch_rows"):
    parts.append(f"micro-batches of {fit['micro_batch_rows']} rows")
  if fit.get("context", 1) > 1:
    parts.append(f"context parallel x{fit['context']}")
  if fit.get("lora_rank"):
    parts.append(f"LoRA rank {fit['lora_rank']} ({fit['trained_parameters'] / 1e6:.1f}M "
                 "trained)")
  if fit.get("optimizer_offload"):
    parts.append("optimiser state in host memory")
  return ", ".join(parts)


def _engine(dec: Mapping) -> str:
  """One engine's share of the batch and its pool, in words."""
  p = dec["pool"]
  return (f"sampling: one engine per data shard ({p['engines']} of {dec['engine_devices']} "
          f"device(s), KV heads split over tensor), each {p['prompts']} prompt(s) stored once "
          f"and {p['rows']} rows (steps compiled for {p['batch_rows']}); pool of "
          f"{p['pages']} pages of {p['page_size']} ({p['prompts']} x {p['prompt_pages']} "
          f"prompt + {p['rows']} x {p['row_pages']} row + 1 scratch, rounded up to a pool "
          f"size)")


def format_table(result: Mapping, hw: hardware.Hardware, est: Mapping) -> str:
  up, dec, m, b = result["update"], result["decode"], result["model"], result["batch"]
  live = dec["pool"]["live_tokens"]
  lines = [
      f"model: {m['parameters'] / 1e9:.2f}B parameters ({m['layers']} layers, hidden "
      f"{m['hidden']}, {m['heads']} heads, {m['kv_heads']} KV heads, vocab {m['vocab']}; "
      f"{m['param_dtype']} params, {m['dtype']} compute)",
      f"batch: {b['prompts']} prompts x {b['rows'] // b['prompts']} = {b['rows']} rows, prompt "
      f"{b['prompt_len']} + completion {b['completion_len']} tokens"
      f"{', shared prefix' if b['shared_prefix'] else ''}, {b['num_passes']} update pass(es)",
      "fit: " + _fit(result.get("fit", {})),
      f"hardware: {hw.name} ({hw.flops / 1e12:.0f} TFLOP/s bf16 dense, "
      f"{hw.hbm_bytes_per_s / 1e12:.1f} TB/s HBM, {hw.hbm_bytes / 1e9:.0f} GB, "
      f"{hw.link_bytes_per_s / 1e9:.0f} GB/s link per direction, NVLink domain {hw.domain})",
      f"trainer mesh {result['mesh']} ({result['mesh_devices']} devices); sampler mesh "
      f"{result['sampler_mesh']} ({result['sampler_devices']} devices"
      f"{', its own' if result['split'] else ', shared with the trainer'})",
      _engine(dec),
      "",
      "per device                        update step      sampling (engine)",
      f"  parameters                    {_gb(up['parameters'])}      {_gb(dec['parameters'])}",
      f"  optimiser state               {_gb(up['optimizer'])}"
      + (f"   (+{up['optimizer_on_host'] / 1e9:.2f} GB in host memory)"
         if up.get("optimizer_on_host") else ""),
      f"  KV pool                                          {_gb(dec['kv_cache'])}"
      f"   (the live tokens' own KV: {dec['kv_live'] / 1e9:.2f} GB)",
      f"  pool bytes per live token                        {dec['kv_cache'] / live:8.0f} B "
      f"   ({dec['kv_cache'] / dec['kv_live']:.3f}x the tokens' own "
      f"{dec['kv_live'] / live:.0f} B)",
      f"  activations, temporaries (XLA){_gb(up['memory']['temporaries'])}      "
      f"{_gb(dec['memory']['temporaries'])}",
      f"  peak (XLA)                    {_gb(up['memory']['peak'])}      "
      f"{_gb(dec['memory']['peak'])}"
      + ("   exceeds HBM" if max(up['memory']['peak'], dec['memory']['peak']) > hw.hbm_bytes
         else "")
      + ("   (optimiser state on the host: bounded, not compiled there)"
         if up['memory'].get('host_estimated') else ""),
      f"  the engine's sampling peak    {_gb(dec['memory']['peak'])} a device: "
      + ("fits" if dec['memory']['peak'] <= hw.hbm_bytes else "does not fit")
      + f" {hw.name}'s {hw.hbm_bytes / 1e9:.0f} GB",
      f"  read per decode step (weights, rows' KV, mean)   "
      f"{_gb(dec['weights_read'] + dec['kv_read'])}"
      f"  (XLA:CPU's bytes: {dec['xla']['bytes_accessed'] / 1e9:.2f} GB)",
      f"  FLOPs, analytic               {up['flops']:11.3e}      {dec['flops']:11.3e}",
      f"    of which recomputed         {up.get('recompute_flops', 0.0):11.3e}"
      f"  ({up.get('recompute_flops', 0.0) / max(up['flops'], 1.0):.0%} of the update)",
      f"  FLOPs, XLA cost_analysis      {up['xla']['flops']:11.3e}      "
      f"{dec['xla']['flops']:11.3e}  (XLA counts a loop's body once: scanned layers"
      f" and micro-batches in the update; the engine's step x{b['completion_len']}:"
      f" {dec['xla']['flops'] * b['completion_len']:.3e})",
  ]
  for name, part in (("update step", up), ("engine step", dec)):
    summary = hlo.summarise_collectives(part["collectives"])
    for kind, s in sorted(summary.items()):
      lines.append(f"  {name} {kind:<19s} x{s['count']:<7d} {s['bytes'] / 1e9:9.3f} GB, "
                   f"{s['wire_bytes'] / 1e9:9.3f} GB on the wire")
  u, d = est["update"], est["decode"]
  t = lambda x: f"{x:10.3g}"
  lines += [
      "",
      "estimated seconds            compute     memory  collectives      total",
      f"  update step            {t(u['compute'])} {t(u['memory'])}   {t(u['collectives'])} "
      f"{t(u['total'])}",
      f"  decode (engine)        {t(d['compute'])} {t(d['memory'])}   {t(d['collectives'])} "
      f"{t(d['total'])}",
      f"  prefill (analytic)     {t(est['prefill'])}",
      f"  weight sync to sampler {t(est['sync'])}",
      f"  GRPO step: train {est['train']:.3g} s, sample {est['sample']:.3g} s, "
      f"step {est['step']:.3g} s"
      + (" (train and sample overlap: own devices, rl.max_staleness >= 1)"
         if est["overlapped"] else " (train, then sample)"),
  ]
  return "\n".join(lines)
