"""The ``deinsum`` command line."""
from __future__ import annotations

import argparse
import sys

from . import __version__
from .errors import DeinsumError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deinsum", description="Communication-optimal distributed einsums.")
    parser.add_argument("--version", action="version", version=f"deinsum {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command is None:
            parser.print_help()
            return 0
        return args.run(args)
    except DeinsumError as exc:
        print(f"deinsum: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
