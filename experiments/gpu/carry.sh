#!/usr/bin/env bash
# The pure-Python packages rlcode imports that the GPU image lacks (seen 2026-12-04: its
# python3 has jax, flax and optax but not tensorflow_datasets or ml_collections), copied from
# this checkout's .venv into .carry/site. `.carry/` is for .git/info/exclude; a device run
# names it in carry, and experiments/gpu/check.sh puts .carry/site on PYTHONPATH when it is
# there.
# Pure Python only: they are copied from this venv's Python (3.11) and run under the
# image's (3.12).
#
#   bash experiments/gpu/carry.sh      # here, before the device run (about 24 MB)
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf .carry/site && mkdir -p .carry/site
tar cf - -C "$SITE" --exclude=__pycache__ --exclude=dummy_data \
  tensorflow_datasets tensorflow_metadata immutabledict promise toml ml_collections |
  tar xf - -C .carry/site
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.carry/' "$EXCLUDE" 2>/dev/null || echo '/.carry/' >> "$EXCLUDE"
du -sh .carry/site
