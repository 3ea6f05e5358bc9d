"""rlcode plan: refusals, the collectives read from optimised HLO, the analytic FLOP count,
and a whole plan of the default job on 72 fake devices."""

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
  report = json.loads(out.read_text())
  result, est = report["result"], report["estimate"]
  up, dec = result["update"], result["decode"]
  total = result["full_params_bytes"]
  # FSDP over 8 splits every matrix (the norm scales, replicated, are small); the
  # sampler's data parallelism holds whole copies.
  assert total / 8 <= up["parameters"] < total / 6
  assert dec["parameters"] == total
  # No tensor parallelism in the sampler: a decode step reads every weight, and its KV.
  assert dec["weights_read"] == total
  np.testing.assert_allclose(est["decode"]["memory"],
                             40 * (total + dec["kv_cache"]) / plan.GPUS["h200"].hbm_bytes_per_s)
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
