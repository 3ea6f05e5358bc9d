"""What the experiment scripts share: statistics over seeds, runs, timing, tables, figures, the
stand-ins and model shapes of the benchmarks, and where results are written.

A script imports these modules, never another script.
"""

import os

# The repository root: scripts run from it (`python -m experiments.<topic>.<script>`).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
