import sys

from rlcode.cli import main

sys.exit(main())
