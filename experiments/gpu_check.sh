#!/usr/bin/env bash
# The accelerator checks in one go (run from the repository root on a GPU machine):
#   1. the kernel tests with the compiled Triton kernels added to the interpreter
#      runs (tests/kernel_impls.py), at the same tolerances as on CPU, and the
#      Hugging Face parity tests (logits, greedy generation) with impl="auto",
#      which is Pallas on GPU;
#   2. experiments/attention_scaling.py in bfloat16 for each impl in $IMPLS,
#      dense XLA attention as the baseline.
# Writes its logs and JSON under $OUT (default experiments/out/gpu).
set -u
OUT=${OUT:-experiments/out/gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false
{
  python3 -c "import jax, jaxlib; print('jax', jax.__version__, jax.devices())"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} 2>&1 | tee "$OUT/env.txt"

# float32 matmuls at full precision on the XLA side too (TF32 is XLA's GPU default).
JAX_DEFAULT_MATMUL_PRECISION=highest timeout "${TEST_TIMEOUT:-240}" \
  python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short -k "not interpret" \
  tests/test_kernels_flash.py tests/test_kernels_decode.py tests/test_kernels_nsa.py \
  tests/test_models_hf.py 2>&1 | tee "$OUT/tests.txt"

for impl in ${IMPLS:-pallas xla}; do
  timeout "${BENCH_TIMEOUT:-150}" python3 experiments/attention_scaling.py --dtype bfloat16 \
    --impl "$impl" --lengths "${LENGTHS:-8192,32768}" --max-gib "${MAX_GIB:-100}" \
    --repeats 5 --budget-s 3 --out "$OUT" 2>&1 | tee "$OUT/bench_$impl.txt"
done
