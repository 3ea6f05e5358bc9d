"""Test setup: eight fake CPU devices, forced before JAX starts.

Multi-device tests run on this fake mesh instead of being skipped, so every sharded
path is exercised on any machine.

The suite compiles with XLA's backend optimisation level 0 and without XLA:CPU's MLIR
fusion emitters: the same programs (these change how a computation is lowered, not what
it computes), compiled in about a fifth of the time, and compiling is most of the suite's
time on 2 cores; the tests' tensors are tiny, so running less optimised code costs little.
Set either flag in XLA_FLAGS to override it (tests/xla_flags.py, which the processes the
tests start use too). Experiments and training runs never see this file.
"""

import os

import xla_flags

_flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if f not in xla_flags.COMPILE]
os.environ["XLA_FLAGS"] = xla_flags.for_subprocess(
    *_flags, "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Per-run directories, made here by pytest's first process, inherited by the xdist
# workers and by the processes tests start, removed at its exit: a second run beside
# this one (another checkout's CI, say) shares nothing with it.
#  - prepared datasets: tests never touch the user's home, and two runs never prepare
#    the same dataset in one directory at once;
#  - the persistent compilation cache: many tests compile the same small programs
#    through fresh jit closures (in-memory caches miss), and the subprocess tests
#    recompile what the workers already did.
import atexit
import shutil
import tempfile

for _variable, _prefix in (("TFDS_DATA_DIR", "rlcode-tests-tfds-"),
                           ("JAX_COMPILATION_CACHE_DIR", "rlcode-tests-jax-cache-")):
  if _variable not in os.environ:
    _path = tempfile.mkdtemp(prefix=_prefix)
    atexit.register(shutil.rmtree, _path, ignore_errors=True)
    os.environ[_variable] = _path
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# The heaviest modules first: with `--dist loadscope` a module runs whole on one
# worker, so one started last leaves the other worker idle at the end.
_HEAVY_FIRST = ("test_fit.py", "test_train.py", "test_readme_commands.py", "test_moe.py",
                "test_export.py", "test_gpu_check_smoke.py", "test_multiprocess.py",
                "test_ablations.py", "test_shared_prefix.py", "test_sampling.py",
                "test_async_rollouts.py", "test_model_kinds.py", "test_swe_mining.py",
                "test_swe_agent.py", "test_harness_mini_swe.py", "test_agent_fuzz.py",
                "test_online.py", "test_agent_train.py", "test_harness_openenv.py",
                "test_plan.py", "test_routing_replay.py")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_HEAVY_FIRST)}
  items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))
