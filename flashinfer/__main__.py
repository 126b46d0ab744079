"""Command line: ``python -m flashinfer <command>`` (also the ``flashinfer`` script)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _replay(args: argparse.Namespace) -> int:
    from .replay import FAILED, check_tolerance, format_results, replay

    directory = args.dir_option or args.dir
    if directory is None:
        print("replay: give the dump directory (DIR or --dir DIR)", file=sys.stderr)
        return 2
    try:
        check_tolerance("--rtol", args.rtol)
        check_tolerance("--atol", args.atol)
        results = replay(
            Path(directory), rtol=args.rtol, atol=args.atol, allow_modules=args.allow_module
        )
    except (FileNotFoundError, ValueError) as err:
        print(f"replay: {err}", file=sys.stderr)
        return 2
    print(format_results(results))
    return 1 if any(r.status in FAILED for r in results) else 0


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


def _non_negative_gb(text: str) -> float:
    """argparse type of --max-gb: the rule FLASHINFER_CACHE_MAX_GB follows."""
    from .config import Config

    try:
        return Config.cache_max_gb.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None


def _path_line(label: str, path: Path) -> str:
    return f"    {label:12} {path}" + ("" if path.exists() else "  (missing)")


def _cache_list(root: Path, paths: bool) -> int:
    """``paths``: under each variant, its generated sources dir and its build.ninja (the
    reference guide's ``ls generated/`` and ``cat cached_ops/*/build.ninja`` steps)."""
    import datetime

    from .jit import cache

    found = cache.entries(root) if root.is_dir() else []
    if not found:
        print(f"no cached modules under {root}")
        return 0
    generated = root.parent / "generated"
    print(f"{'module':32} {'variant':16} {'size MB':>8}  {'last used':19}  {'archs':10} status")
    for entry in found:
        when = datetime.datetime.fromtimestamp(entry.last_used).strftime("%Y-%m-%d %H:%M:%S")
        print(
            f"{entry.uri:32} {entry.digest:16} {entry.size_bytes / 1e6:8.2f}  {when}  "
            f"{' '.join(entry.archs):10} {entry.problem or 'ok'}"
        )
        if paths:
            print(_path_line("generated:", generated / entry.uri))
            print(_path_line("build.ninja:", entry.path / "build.ninja"))
    total = sum(e.size_bytes for e in found)
    damaged = sum(e.problem is not None for e in found)
    print(
        f"{len(found)} variant(s), {total / 1e6:.1f} MB in {root}"
        + (f"; {damaged} would be rebuilt on load" if damaged else "")
    )
    return 0


def _cache_verify(root: Path) -> int:
    """Hash every cached library and AOT layer library; damaged cache variants are removed
    (the next load rebuilds them), damaged AOT libraries only reported (layers are read-only)."""
    from .jit import aot, cache

    bad = 0
    for entry in cache.entries(root) if root.is_dir() else []:
        problem = cache.verify(entry)
        if problem is not None:
            bad += 1
            cache.remove(entry)
            print(f"removed {entry.uri}/{entry.digest}: {problem}")
    for library, problem in aot.verify_layers().items():
        if problem is not None:
            bad += 1
            print(f"AOT library {library}: {problem}; precompile the layer again")
    print(f"{bad} damaged librar{'y' if bad == 1 else 'ies'}" if bad else "every library verified")
    return 1 if bad else 0


def _cache(args: argparse.Namespace) -> int:
    from .config import config
    from .jit import cache, env

    config.validate()
    # Listing and verifying read the configured workspace and never create it.
    root = env.configured_workspace() / "cached_ops"
    if args.cache_command == "list":
        return _cache_list(root, args.paths)
    if args.cache_command == "verify":
        return _cache_verify(root)
    if args.cache_command == "clear":
        removed = cache.clear(args.module)
        print(
            f"removed {len(removed)} variant(s), {sum(e.size_bytes for e in removed) / 1e6:.1f} MB"
        )
    else:
        evicted = cache.evict(args.max_gb * 1e9)
        print(
            f"evicted {len(evicted)} variant(s), {sum(e.size_bytes for e in evicted) / 1e6:.1f} MB"
        )
    return 0


def _precompile(args: argparse.Namespace) -> int:
    from .config import config
    from .jit.builder import JitCompileError
    from .jit.precompile import precompile

    config.validate()
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    try:
        result = precompile(Path(args.out), args.arch, ops)
    except (ValueError, JitCompileError) as err:
        print(f"precompile: {err}", file=sys.stderr)
        return 1
    for library in result.published:
        print(library)
    for name, reason in result.skipped.items():
        print(f"skipped {name}: {reason}", file=sys.stderr)
    print(
        f"{len(result.published)} module(s) in {args.out}; use it with "
        f"FLASHINFER_AOT_DIR={args.out}"
    )
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import run_checks

    return run_checks()


def main(argv: list[str] | None = None) -> int:
    from .version import __version__

    parser = argparse.ArgumentParser(prog="flashinfer", description="flashinfer tools")
    parser.add_argument("--version", action="version", version=f"flashinfer {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    replay = commands.add_parser("replay", help="re-run dumped API calls and compare outputs")
    replay.add_argument("dir", nargs="?", help="dump directory (FLASHINFER_DUMP_DIR)")
    replay.add_argument("--dir", dest="dir_option", help="the same, as an option")
    replay.add_argument("--rtol", type=float, default=None, help="relative tolerance")
    replay.add_argument("--atol", type=float, default=None, help="absolute tolerance")
    replay.add_argument(
        "--allow-module",
        action="append",
        default=[],
        metavar="MODULE",
        help="also run @flashinfer_api functions of MODULE and its submodules "
        "(repeatable; by default only flashinfer's)",
    )
    replay.set_defaults(run=_replay)

    show = commands.add_parser("show-config", help="every FLASHINFER_* setting and its source")
    show.set_defaults(run=_show_config)

    cache_parser = commands.add_parser("cache", help="inspect and trim the JIT module cache")
    cache_commands = cache_parser.add_subparsers(dest="cache_command", required=True)
    listing = cache_commands.add_parser(
        "list", help="cached modules: size, last use, archs, status"
    )
    listing.add_argument(
        "--paths",
        action="store_true",
        help="also each variant's generated sources dir and build.ninja",
    )
    cache_commands.add_parser(
        "verify",
        help="hash every cached and AOT library against its record; remove damaged cached ones",
    )
    clear = cache_commands.add_parser("clear", help="remove cached modules")
    clear.add_argument("--module", help="only modules whose name matches (wildcards)")
    gc = cache_commands.add_parser("gc", help="evict least recently used modules")
    gc.add_argument(
        "--max-gb", type=_non_negative_gb, required=True, help="size to trim the cache to"
    )
    cache_parser.set_defaults(run=_cache)

    pre = commands.add_parser("precompile", help="build every module into a read-only AOT layer")
    pre.add_argument("--arch", required=True, help='target archs, e.g. "9.0a 10.0a"')
    pre.add_argument("--ops", help="comma list of ops (default: all registered)")
    pre.add_argument("--out", required=True, help="the AOT layer dir to write")
    pre.set_defaults(run=_precompile)

    doctor = commands.add_parser("doctor", help="check the toolchain, GPU and workspace")
    doctor.set_defaults(run=_doctor)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
