"""The `radixrt` console script: `radixrt launch-server [flags]` (flags named as in SGLang)."""

from __future__ import annotations

import argparse
import sys

from radixrt.config import ServerArgs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixrt", description="radixrt LLM serving runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    launch = sub.add_parser("launch-server", help="Start the OpenAI-compatible server.")
    ServerArgs.add_cli_args(launch)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "launch-server":
        try:
            args = ServerArgs.from_cli_args(ns)
        except ValueError as e:
            parser.error(str(e))
        from radixrt.launcher import launch_server

        sys.exit(launch_server(args))


if __name__ == "__main__":
    main()
