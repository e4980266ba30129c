"""The `radixrt` console script: `radixrt launch-server [flags]` (flags named as in SGLang)."""

from __future__ import annotations

import argparse
import sys

from radixrt.config import ServerArgs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixrt", description="radixrt LLM serving runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    launch = sub.add_parser("launch-server", help="Start the OpenAI-compatible server.",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ServerArgs.add_cli_args(launch)
    sub.add_parser("bench-serving", add_help=False,
                   help="Load-test an OpenAI-compatible server (bench/serving.py; --help for flags).")
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench-serving"]:  # its flags belong to the benchmark's own parser
        from radixrt.bench.serving import main as bench_serving

        sys.exit(bench_serving(argv[1:]))
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
