"""The ``cortex`` command line."""

from __future__ import annotations

import argparse
import sys

import cortex


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cortex", description=cortex.__doc__)
    parser.add_argument("--version", action="version", version=f"cortex {cortex.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="simulated cluster feeding the ledger, with faults")
    demo.add_argument("--seconds", type=float, default=8.0, help="length of the traffic phase")
    demo.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.command == "demo":
        import trio

        from cortex.demo import run_demo

        return 0 if trio.run(run_demo, args.seconds, args.seed) else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
