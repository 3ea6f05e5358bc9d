#!/usr/bin/env bash
# The accelerator check in one run, from the repository root on a GPU machine
# (one H200: under 10 minutes, each part under its own time limit; their sum,
# 565 s, fits the device tool's 600 s a command):
#   1. tests: the kernel tests with the compiled Triton kernels and cuDNN added
#      to the interpreter runs (tests/kernel_impls.py), at the same tolerances
#      as on CPU, and the Hugging Face parity tests with impl="auto";
#   2. experiments.gpu.attention_vs_cudnn: dense, sliding, document (16
#      documents) and NSA against cuDNN at 8k, 32k and 64k;
#   3. experiments.speed.shared_prefix_update: the shared-prompt update per token;
#   4. experiments.gpu.decode_roofline: decode steps against the HBM bound;
#   5. experiments.gpu.decode_profile: the decode step's kernel time against its
#      wall-clock, with XLA's command buffers as they are, off, and over loops, and
#      with cuBLAS for the matrix products;
#   6. experiments.gpu.kv_offload: prompt KV in pinned host memory vs on device.
# Every part writes its JSON (<part>.json, rows as they finish) and its log
# (<part>.txt) to one run folder, $OUT (default results/gpu/check_<UTC date>), whose
# manifest.json (experiments.lib.results) records this command; a part cut by its
# limit keeps its rows.
#
#   bash experiments/gpu/carry.sh                 # here: .carry/site, what the GPU image lacks
#   bash experiments/gpu/check.sh                 # on the GPU (the device run carries .carry)
#   SMOKE=1 OUT=/tmp/smoke bash experiments/gpu/check.sh   # CPU: tiny sizes, no tests
set -u
cd "$(dirname "$0")/../.."  # the repository root: the parts run as `python -m experiments...`
OUT=${OUT:-results/gpu/check_$(date -u +%Y-%m-%d)}
SMOKE=${SMOKE:-0}
CARRY_SITE=
[ "$SMOKE" != 1 ] && [ -d .carry/site ] && CARRY_SITE=$PWD/.carry/site
mkdir -p "$OUT"
# The carried packages (gpu/carry.sh) for the GPU image's python; rlcode and experiments
# import from the repository root, the parts' working directory.
[ -n "$CARRY_SITE" ] && export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$CARRY_SITE
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export RESULTS_COMMAND="${RESULTS_COMMAND:-SMOKE=$SMOKE bash experiments/gpu/check.sh}"
PY=${PYTHON:-python3}
if [ "$SMOKE" = 1 ]; then
  ARGS=(--smoke)
  LIMIT=900  # a loaded CPU compiles slowly; the limits below are sized for the GPU
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
else
  ARGS=()
  LIMIT=
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
fi
{
  "$PY" -c "import jax, jaxlib; print('jax', jax.__version__, jax.devices())"
  command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} 2>&1 | tee "$OUT/env.txt"

part() {  # part NAME LIMIT_S COMMAND...: runs COMMAND under a time limit, logs to $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
  echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s (limit $limit s)" |
    tee -a "$OUT/$name.txt"
}

if [ "$SMOKE" != 1 ]; then
  # float32 matmuls at full precision on the XLA side too (TF32 is XLA's GPU default).
  JAX_DEFAULT_MATMUL_PRECISION=highest part tests "${TEST_TIMEOUT:-90}" \
    "$PY" -m pytest -q -n 8 -p no:cacheprovider --tb=short -k "not interpret" \
    tests/test_kernels_flash.py tests/test_kernels_decode.py tests/test_kernels_nsa.py \
    tests/test_kernels_dispatch.py tests/test_models_hf.py
fi
part attention_vs_cudnn "${ATTENTION_TIMEOUT:-${LIMIT:-135}}" \
  "$PY" -m experiments.gpu.attention_vs_cudnn ${ARGS[@]+"${ARGS[@]}"} --out "$OUT"
part shared_prefix_update "${UPDATE_TIMEOUT:-${LIMIT:-100}}" \
  "$PY" -m experiments.speed.shared_prefix_update ${ARGS[@]+"${ARGS[@]}"} --out "$OUT"
part decode_roofline "${ROOFLINE_TIMEOUT:-${LIMIT:-40}}" \
  "$PY" -m experiments.gpu.decode_roofline ${ARGS[@]+"${ARGS[@]}"} --out "$OUT"
part decode_profile "${PROFILE_TIMEOUT:-${LIMIT:-130}}" \
  "$PY" -m experiments.gpu.decode_profile ${ARGS[@]+"${ARGS[@]}"} --out "$OUT"
part kv_offload "${OFFLOAD_TIMEOUT:-${LIMIT:-70}}" \
  "$PY" -m experiments.gpu.kv_offload ${ARGS[@]+"${ARGS[@]}"} --out "$OUT"
echo "== total $SECONDS s"
