"""`python -m rlcode.plan ARGS_JSON`: the worker `rlcode.plan.plan` starts with N fake devices."""

import sys

from rlcode.plan import _worker_main

sys.exit(_worker_main(sys.argv[1:]))
