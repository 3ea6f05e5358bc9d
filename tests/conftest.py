"""Test setup: eight fake CPU devices, forced before JAX starts.

Multi-device tests run on this fake mesh instead of being skipped (STYLE.md 7).
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Data builders and checkpoints of a test never touch the user's home.
os.environ.setdefault("TFDS_DATA_DIR", "/tmp/rlcode-tests-tfds")
