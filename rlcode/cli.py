"""`rlcode <command> --config FILE [--config.a.b=value ...]`.

Each command is a thin shell around an importable function, so notebooks and
experiments call the same code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlcode import config_lib


def _add_config(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--config", required=True,
                      help="configs/NAME.py[:arg]; override keys with --config.a.b=value")


def _parse(argv: Sequence[str]):
  parser = argparse.ArgumentParser(prog="rlcode", description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", required=True)
  _add_config(commands.add_parser("sample", help="sample completions from a policy"))
  args, rest = parser.parse_known_args(argv)
  unknown = [a for a in rest if not a.startswith(config_lib.PREFIX)]
  if unknown:
    parser.error(f"unrecognised arguments: {' '.join(unknown)}")
  return args, rest


def main(argv: Sequence[str] | None = None) -> int:
  args, overrides = _parse(sys.argv[1:] if argv is None else argv)
  config = config_lib.load_config(args.config, overrides)
  if args.command == "sample":
    from rlcode import jobs
    jobs.sample(config)
  return 0


if __name__ == "__main__":
  sys.exit(main())
