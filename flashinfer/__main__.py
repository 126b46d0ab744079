"""Command line: ``python -m flashinfer <command>`` (also the ``flashinfer`` script)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _replay(args: argparse.Namespace) -> int:
    from .replay import format_results, replay

    directory = args.dir_option or args.dir
    if directory is None:
        print("replay: give the dump directory (DIR or --dir DIR)", file=sys.stderr)
        return 2
    try:
        results = replay(Path(directory), rtol=args.rtol, atol=args.atol)
    except FileNotFoundError as err:
        print(f"replay: {err}", file=sys.stderr)
        return 2
    print(format_results(results))
    return 1 if any(r.status in ("FAIL", "ERROR") for r in results) else 0


def _show_config(args: argparse.Namespace) -> int:
    from .config import Config

    for var in Config.variables():
        raw = var.raw()
        try:
            value = var.read()
        except ValueError as err:
            value = f"INVALID: {err}"
        source = "environment" if raw is not None else "default"
        print(f"{var.name:30} {str(value):40} ({source})  {var.doc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashinfer", description="flashinfer tools")
    commands = parser.add_subparsers(dest="command", required=True)

    replay = commands.add_parser("replay", help="re-run dumped API calls and compare outputs")
    replay.add_argument("dir", nargs="?", help="dump directory (FLASHINFER_DUMP_DIR)")
    replay.add_argument("--dir", dest="dir_option", help="the same, as an option")
    replay.add_argument("--rtol", type=float, default=None, help="relative tolerance")
    replay.add_argument("--atol", type=float, default=None, help="absolute tolerance")
    replay.set_defaults(run=_replay)

    show = commands.add_parser("show-config", help="every FLASHINFER_* setting and its source")
    show.set_defaults(run=_show_config)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
