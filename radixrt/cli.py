"""The `radixrt` console script: `radixrt launch-server [flags]` (flags named as in SGLang), and
`radixrt launch-fleet [flags]` (several servers behind the smg gateway: radixrt/fleet.py)."""

from __future__ import annotations

import argparse
import sys

from radixrt.config import ServerArgs
from radixrt.fleet_config import add_cli_args as add_fleet_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixrt", description="radixrt LLM serving runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    launch = sub.add_parser("launch-server", help="Start the OpenAI-compatible server.",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ServerArgs.add_cli_args(launch)
    fleet = sub.add_parser("launch-fleet", help="Start several models / replicas behind one gateway (smg).")
    add_fleet_args(fleet)
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
    if ns.command == "launch-fleet":
        sys.exit(_launch_fleet(parser, ns))


def _launch_fleet(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> int:
    from radixrt.fleet_config import build_config
    from radixrt.gateway import smg_available

    try:
        cfg = build_config(ns)
    except ValueError as e:
        parser.error(str(e))
    if not smg_available():
        print("radixrt: error: launch-fleet needs the smg gateway: pip install 'radixrt[fleet]'",
              file=sys.stderr)
        return 2
    from radixrt.fleet import launch_fleet

    return launch_fleet(cfg)


if __name__ == "__main__":
    main()
