"""The GPU check runs end to end at tiny sizes on a CPU, so a GPU session can run it unchanged.

`SMOKE=1 bash experiments/gpu/check.sh` runs every Python part of the check
with --smoke (the tests part needs a GPU and is left out); each part must
exit 0 and write its JSON with the fields the tables are made of. The
numbers themselves mean nothing at these sizes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import xla_flags

pytestmark = pytest.mark.slow  # runs every part of the GPU check at tiny sizes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  out = tmp_path_factory.mktemp("gpu_check")
  env = dict(os.environ, SMOKE="1", OUT=str(out), PYTHON=sys.executable, JAX_PLATFORMS="cpu")
  # One CPU device, as a plain run of the scripts (compiled as the rest of the suite: conftest.py).
  env["XLA_FLAGS"] = xla_flags.for_subprocess()
  proc = subprocess.run(["bash", "experiments/gpu/check.sh"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=1800, check=False)
  return out, proc


def _load(out, name):
  with open(os.path.join(out, f"{name}.json")) as f:
    return json.load(f)


@pytest.mark.parametrize("part", ["attention_vs_cudnn", "decode_roofline", "decode_profile",
                                  "kv_offload", "shared_prefix_update"])
def test_part_exits_cleanly(smoke, part):
  out, proc = smoke
  assert proc.returncode == 0, proc.stderr[-2000:]
  with open(os.path.join(out, f"{part}.txt")) as f:
    log = f.read()
  assert f"== {part}: exit 0" in log, log[-2000:]


def test_attention_rows(smoke):
  rows = _load(smoke[0], "attention_vs_cudnn")["rows"]
  names = {r["name"] for r in rows}
  assert names == {"cudnn_dense", "dense/auto", "sliding/auto", "document/auto", "nsa/auto"}
  for r in rows:
    assert "error" not in r, r
    assert r["fwd"]["ms"] > 0 and r["fwd_bwd"]["ms"] > 0
    assert r["runs_as"] == ("library:xla" if r["name"] == "cudnn_dense" else "xla")
  dense = next(r for r in rows if r["name"] == "dense/auto")
  assert dense["max_abs_diff_vs_baseline"] < 1e-5  # our dense causal equals the library's


def test_roofline_update_and_offload_rows(smoke):
  out = smoke[0]
  roof = _load(out, "decode_roofline")["rows"][0]
  assert roof["bytes_per_step"]["weights"] > 0 and roof["bound_ms"] > 0
  (profile,) = _load(out, "decode_profile")["rows"]
  assert profile["variant"] == "default" and "error" not in profile, profile
  # (generate's time less the prompt's, over the steps: at these sizes, on a loaded CPU,
  # the difference can come out below zero; the GPU sizes are where it means something)
  assert math.isfinite(profile["step_ms"])
  # A CPU has no device plane: nothing traced, and the row says its kernel columns are void.
  assert profile["kernel_ms_per_step"] == 0 and profile["kernels_traced"] is False
  update = _load(out, "shared_prefix_update")["rows"][0]
  assert update["shared_tokens"] == 32 + 2 * 16 and update["repeated_tokens"] == 2 * 48
  assert update["per_token_ratio"] > 0
  offload = _load(out, "kv_offload")["rows"]
  assert [(r["context"], r["batch"]) for r in offload] == [(64, 1), (64, 2)]
  for r in offload:
    assert r["device_step_ms"] > 0 and r["host_step_ms"] > 0 and r["copy_ms"] > 0, r
