"""rlcode plan: refusals, the collectives read from optimised HLO, the analytic FLOP count,
the engine's pool and its compiled decode step, and a whole plan of the default job on 72
fake devices."""

import pytest
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlcode import cli, plan
from rlcode.models import Decoder, ModelConfig
from rlcode.parallel import sharding
from rlcode.engine.pages import pool_pages
from rlcode.plan import analysis, sampler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN = os.path.join(ROOT, "configs", "qwen2_7b_plan.py")
TINY = os.path.join(ROOT, "configs", "grpo_tiny.py")


@pytest.mark.slow
def test_a_mesh_that_does_not_divide_the_model_is_one_line(capsys):
  argv = ["plan", "--config", QWEN, "--devices", "gb200-nvl72", "--mesh", "data=1,fsdp=9,tensor=8"]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err
  for part in ("heads=28 over tensor=8", "kv_heads=4 over tensor=8", "embed=3584 over fsdp=9",
               "rows=64 over data x fsdp=9"):
    assert part in err
  assert cli.main(["plan", "--config", QWEN, "--devices", "h200x8", "--mesh", "fsdp=16"]) == 2
  assert "need 16 devices" in capsys.readouterr().err
  assert cli.main(["plan", "--config", QWEN, "--devices", "dgx", "--mesh", "fsdp=8"]) == 2
  assert "gb200-nvl72" in capsys.readouterr().err


def test_collectives_with_their_bytes_groups_and_loop_counts():
  mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
  x = jax.device_put(jnp.ones((64, 32), jnp.float32), NamedSharding(mesh, P("b", "a")))

  def f(x):
    gathered = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, "a")))
    def body(i, acc):  # a sum over "b" inside a loop of 5, loop-variant so it stays inside
      return acc + jnp.sum(x * i.astype(jnp.float32), axis=0)
    looped = jax.lax.fori_loop(0, 5, body, jnp.zeros((32,), jnp.float32))
    return gathered, looped

  compiled = jax.jit(f, out_shardings=(NamedSharding(mesh, P(None, "a")),
                                       NamedSharding(mesh, P()))).lower(x).compile()
  found = plan.collectives(compiled.as_text(), 8)
  gathers = [c for c in found if c["kind"] == "all-gather"]
  # x [64, 32] split 4 ways on rows and 2 on columns, gathered over the 4: [64, 16] f32;
  # the loop's sum [32], split 2 ways on columns, gathered over the 2 for its replicated
  # output: [32] f32.
  assert sorted((c["bytes"], c["group"], c["times"]) for c in gathers) == [
      (32 * 4, 2, 1), (64 * 16 * 4, 4, 1)]
  gathers.sort(key=lambda c: -c["bytes"])
  assert plan.wire_bytes(gathers[0]) == 64 * 16 * 4 * 3 / 4
  # Device d sits at a = d // 4, b = d % 4: "b" groups consecutive devices, "a" strides 4.
  assert sorted(gathers[0]["groups"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert sorted(gathers[1]["groups"]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
  sums = [c for c in found if c["kind"] == "all-reduce"]
  # The column sums of each device's [16, 16] block, reduced over "b" in every trip.
  assert sum(c["times"] for c in sums) == 5
  for c in sums:
    assert sorted(c["groups"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
  hw = plan.Hardware("test", 1e12, 1e12, 1e9, 1e9, domain=4, network_bytes_per_s=1e6)
  # Groups of 4 consecutive devices stay within a domain of 4; others cross it.
  within = {**gathers[0], "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}
  across = {**gathers[0], "groups": [[0, 2, 4, 6], [1, 3, 5, 7]]}
  assert plan.collective_seconds([within], hw) == plan.wire_bytes(within) / 1e9
  assert plan.collective_seconds([across], hw) == plan.wire_bytes(across) / 1e6


def test_engine_pool_is_prompts_once_rows_own_pages_and_scratch():
  # 3 prompts over 2 engines: 2 a engine, 16 rows; prompts of 250 in pages of 16 (16 pages,
  # the last partial); each row's copy of it and 20 completion tokens: 3 pages.
  pool = sampler.engine_pool(3, 8, 250, 20, engines=2, page_size=16)
  assert (pool.prompts, pool.rows, pool.batch_rows) == (2, 16, 16)
  assert (pool.prompt_pages, pool.row_pages, pool.table_width) == (16, 3, 17)
  assert pool.pages == pool_pages(2 * 16 + 16 * 3 + 1) and pool.live_tokens == 2 * 250 + 16 * 20
  # Fewer prompts than engines: one each; 6 rows step as the engine's bucket of 8.
  small = sampler.engine_pool(1, 6, 32, 16, engines=4, page_size=16)
  assert (small.prompts, small.rows, small.batch_rows, small.pages) == (1, 6, 8, pool_pages(2 + 12 + 1))
  with pytest.raises(ValueError, match="engines=0"):
    sampler.engine_pool(3, 8, 250, 20, engines=0, page_size=16)


def test_engine_decode_step_fits_where_whole_row_caches_do_not():
  """One engine of a data=2, tensor=2 sampler mesh: its donated pools are the formula's
  pages with KV heads split over tensor, and its whole compiled step (weights, pools,
  temporaries) takes less than the KV of 16 rows' caches allocated whole would alone."""
  cfg = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16, max_seq_len=1024)
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
  mesh = sharding.make_mesh(data=2, tensor=2, devices=jax.devices()[:4])
  pool = sampler.engine_pool(4, 8, 500, 12, engines=2, page_size=16)
  assert pool.pages == pool_pages(2 * 32 + 16 * 2 + 1)
  compiled, placed, pools = sampler.compile_decode(cfg, graphdef, state, mesh, pool,
                                                   analysis.COMPILE_OPTIONS)
  k = pools[0][0]
  assert k.shape == (pool.pages, 2, 16, 16)
  assert k.sharding.shard_shape(k.shape) == (pool.pages, 1, 16, 16)
  # Per device and position: 2 layers x (k, v) x 1 KV head x 16 x float32.
  token_bytes = 2 * 2 * 1 * 16 * 4
  pool_bytes = analysis._shard_bytes(pools)
  assert pool_bytes == pool.pages * 16 * token_bytes
  memory = analysis._memory(compiled)
  assert memory["aliased"] >= pool_bytes  # the pools are updated in place
  assert memory["peak"] >= pool_bytes + analysis._shard_bytes(placed)
  whole_rows = pool.rows * (500 + 12) * token_bytes
  assert memory["peak"] < whole_rows, (memory, whole_rows)


def test_an_engine_on_a_tensor_axis_never_gathers_a_weight():
  """The decode step of an engine on tensor=4 computes with its weights' shards: no
  all-gather in it is as large as the smallest split weight (the fused MLP's [embed, 2,
  mlp] once was gathered whole, every step, to be reshaped)."""
  cfg = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=256, num_layers=2,
                    num_heads=8, num_kv_heads=4, head_dim=16, max_seq_len=256)
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
  mesh = sharding.make_mesh(tensor=4, devices=jax.devices()[:4])
  pool = sampler.engine_pool(1, 8, 64, 16, engines=1, page_size=16)
  compiled, placed, _ = sampler.compile_decode(cfg, graphdef, state, mesh, pool,
                                               analysis.COMPILE_OPTIONS)
  split = [v for v in jax.tree.leaves(placed) if v.sharding.shard_shape(v.shape) != v.shape]
  assert split  # heads, mlp and vocab are split over tensor
  smallest = min(np.prod(v.shape) * v.dtype.itemsize for v in split)
  gathers = [c for c in plan.collectives(compiled.as_text(), 4) if c["kind"] == "all-gather"]
  assert all(c["bytes"] < smallest for c in gathers), (smallest, gathers)


@pytest.mark.slow
def test_analytic_forward_flops_match_xla_on_a_loop_free_forward():
  cfg = ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=768, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=64, max_seq_len=128,
                    attn_impl="reference")
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  b, t = 4, 64

  def forward(state, tokens):
    m = nnx.merge(graphdef, state)
    h, _ = m.hidden(tokens)
    return m.logits(h)

  xla = jax.jit(forward).lower(state, jnp.zeros((b, t), jnp.int32)).compile().cost_analysis()
  xla = (xla[0] if isinstance(xla, (list, tuple)) else xla)["flops"]
  # The dense reference computes the whole T x T score matrix, masked afterwards.
  analytic = plan.forward_flops(cfg, b * t, b * t * t, b * t)
  assert 0.97 < xla / analytic < 1.1, (xla, analytic)


@pytest.mark.slow
def test_plan_of_the_default_job_on_72_devices(tmp_path, capsys):
  out = tmp_path / "plan.json"
  # 64 prompts, so that the prompts as well as the rows divide over the 64 devices.
  argv = ["plan", "--config", TINY, "--devices", "72", "--mesh", "data=8,fsdp=8",
          "--sampler-mesh", "data=8", "--prompt-len", "64", "--json", str(out),
          "--config.rl.prompts_per_step=64"]
  assert cli.main(argv) == 0
  table = capsys.readouterr().out
  assert "trainer mesh data=8,fsdp=8 (64 devices)" in table
  assert "sampler mesh data=8 (8 devices, its own)" in table
  assert "one engine per data shard (8 of 1 device(s)" in table
  assert "the engine's sampling peak" in table
  report = json.loads(out.read_text())
  result, est = report["result"], report["estimate"]
  up, dec = result["update"], result["decode"]
  total = result["full_params_bytes"]
  # FSDP over 8 splits every matrix (the norm scales, replicated, are small); the
  # sampler's data parallelism holds whole copies.
  assert total / 8 <= up["parameters"] < total / 6
  assert dec["parameters"] == total
  # No tensor parallelism in the sampler: a decode step reads every weight, and each row's
  # pages: its prompt of 64 and, on average, half its 40 completion tokens.
  assert dec["weights_read"] == total
  # 8 engines of one device, 8 prompts each: pages of 16, 4 a prompt, 4 a row's own (the
  # pool rounded up to the size generate allocates).
  assert dec["pool"]["engines"] == 8 and dec["pool"]["rows"] == 64
  assert dec["pool"]["pages"] == pool_pages(8 * 4 + 64 * 4 + 1)  # 289, allocated as 320
  token_bytes = 4 * 2 * 2 * 32 * 4  # layers x (k, v) x KV heads x head_dim x float32
  assert dec["kv_cache"] == dec["pool"]["pages"] * 16 * token_bytes
  assert dec["kv_live"] == (8 * 64 + 64 * 40) * token_bytes
  assert dec["kv_read"] == 64 * (64 + 39 / 2) * token_bytes
  assert dec["memory"]["peak"] >= dec["kv_cache"] + dec["parameters"]
  np.testing.assert_allclose(est["decode"]["memory"],
                             40 * (total + dec["kv_read"]) / plan.GPUS["h200"].hbm_bytes_per_s)
  # Adam's two moments are laid out like their parameters, not replicated.
  assert 2 * up["parameters"] <= up["optimizer"] < 2 * up["parameters"] + 64
  assert up["memory"]["peak"] > up["parameters"] + up["optimizer"]
  assert {c["kind"] for c in up["collectives"]} >= {"all-gather", "all-reduce"}
  # Every device computes its share of the batch and no more.
  assert 0.8 < up["xla"]["flops"] / up["flops"] < 1.3
  np.testing.assert_allclose(est["update"]["compute"],
                             max(up["flops"], up["xla"]["flops"]) / plan.GPUS["h200"].flops)
  assert est["sync"] > 0 and est["step"] > 0 and est["overlapped"] is False  # eta = 0
  np.testing.assert_allclose(est["update"]["total"],
                             max(est["update"]["compute"], est["update"]["memory"])
                             + est["update"]["collectives"])


@pytest.mark.slow
def test_plan_counts_what_makes_a_model_fit(tmp_path, capsys):
  """Scanned, rematerialised LoRA with chunked log-probs, micro-batches, context
  parallelism and the optimiser state in host memory: the plan compiles that update and
  counts it (trained parameters, host bytes, recomputation)."""
  out = tmp_path / "plan.json"
  argv = ["plan", "--config", TINY, "--devices", "8", "--mesh", "fsdp=4,context=2",
          "--prompt-len", "64", "--json", str(out), "--config.model.scan_layers=true",
          "--config.model.remat=full", "--config.model.logits_chunk=16",
          "--config.model.lora.rank=4", "--config.optimizer.offload=true",
          "--config.rl.micro_batch_rows=64"]
  assert cli.main(argv) == 0
  table = capsys.readouterr().out
  assert "fit: remat full, scanned layers, log-probs in chunks of 16 positions, " in table
  assert "context parallel x2, LoRA rank 4" in table and "host memory" in table
  result = json.loads(out.read_text())["result"]
  up, fit = result["update"], result["fit"]
  assert fit["context"] == 2 and fit["lora_rank"] == 4 and fit["micro_batch_rows"] == 64
  assert 0 < fit["trained_parameters"] < result["model"]["parameters"] / 10
  # Adam's moments of the adapters alone, all of them in host memory.
  assert up["optimizer"] == 0 and up["optimizer_on_host"] >= 8 * fit["trained_parameters"] / 4
  assert up["memory"]["host"] >= up["optimizer_on_host"]
  if up["memory"].get("host_estimated"):  # CPU: XLA counted the state among the arguments
    assert up["memory"]["peak"] >= up["memory"]["xla_peak"] - up["optimizer_on_host"]
    assert up["memory"]["peak"] < up["memory"]["xla_peak"]
  # Full remat recomputes the forward's blocks once more.
  assert up["recompute_flops"] > 0.2 * up["forward_flops"]
