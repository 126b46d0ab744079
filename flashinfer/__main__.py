"""Command line: ``python -m flashinfer <command>`` (also the ``flashinfer`` script)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .jit.aot import Target
    from .jit.remote import IndexEntry, RepositoryIndex


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


def _artifacts_list(index: RepositoryIndex, target: Target, base: str) -> int:
    from .jit import env, remote

    print(f"{'module':32} {'op':12} {'archs':12} {'size MB':>8}  status")
    present = 0
    for uri, entry in sorted(index.modules.items()):
        problem = target.mismatch(entry)
        downloaded = remote.is_present(entry)
        present += downloaded
        status = ("downloaded" if downloaded else "available") + (
            "" if problem is None else f", not for this machine (other {problem})"
        )
        archs = " ".join(str(a) for a in entry.archs)
        print(f"{uri:32} {entry.op or '-':12} {archs:12} {entry.size / 1e6:8.2f}  {status}")
    print(f"{len(index.modules)} module(s) in {base}; {present} downloaded in {env.cubin_dir()}")
    return 0


def _artifacts_download(index: RepositoryIndex, target: Target, ops: list[str]) -> int:
    from .jit import env, remote

    unknown = sorted(set(ops) - {entry.op for entry in index.modules.values()})
    if unknown:
        print(
            f"artifacts: the repository has no module of op(s) {', '.join(unknown)}",
            file=sys.stderr,
        )
        return 1
    wanted = [
        entry
        for entry in index.modules.values()
        if (not ops or entry.op in ops) and target.mismatch(entry) is None
    ]
    if not wanted:
        print("artifacts: no module of the repository is built for this target", file=sys.stderr)
        return 1
    todo = [entry for entry in wanted if not remote.is_present(entry)]
    done: list[int] = []
    tty = sys.stderr.isatty()

    def progress(entry: IndexEntry, ok: bool) -> None:
        done.append(entry.size if ok else 0)
        line = f"downloading modules: {len(done)}/{len(todo)}, {sum(done) / 1e6:.1f} MB"
        print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    results = remote.download_all(todo, target, progress)
    if tty and todo:
        print(file=sys.stderr)
    failed = sorted(uri for uri, ok in results.items() if not ok)
    print(
        f"{len(todo) - len(failed)} module(s) downloaded, {len(wanted) - len(todo)} already "
        f"there, {len(failed)} failed; in {env.cubin_dir()}"
    )
    if failed:
        print(f"artifacts: not downloaded: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _artifacts(args: argparse.Namespace) -> int:
    from .config import config
    from .jit import aot, env, remote
    from .jit.arch import parse_arch_list

    config.validate()
    if args.artifacts_command == "clear":
        removed = remote.clear()
        print(f"removed {len(removed)} downloaded module(s) from {env.cubin_dir()}")
        return 0
    base = config.cubins_repository
    if base is None:
        print(
            "artifacts: set FLASHINFER_CUBINS_REPOSITORY to the repository's URL", file=sys.stderr
        )
        return 1
    if config.no_download:
        print(
            "artifacts: FLASHINFER_NO_DOWNLOAD=1 forbids contacting the repository", file=sys.stderr
        )
        return 1
    try:
        archs = parse_arch_list(args.arch, "--arch") if args.arch else None
        target = aot.Target.current(archs)
        index = remote.repository_index(base)
    except (ValueError, remote.DownloadError) as err:
        print(f"artifacts: {err}", file=sys.stderr)
        return 1
    if args.artifacts_command == "list":
        return _artifacts_list(index, target, base)
    ops = [op.strip() for item in args.ops or [] for op in item.split(",") if op.strip()]
    return _artifacts_download(index, target, ops)


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

    artifacts = commands.add_parser(
        "artifacts", help="modules of the repository FLASHINFER_CUBINS_REPOSITORY"
    )
    artifact_commands = artifacts.add_subparsers(dest="artifacts_command", required=True)
    download = artifact_commands.add_parser(
        "download", help="download the repository's modules for this machine's archs"
    )
    available = artifact_commands.add_parser(
        "list", help="the repository's modules and whether each is downloaded / for this machine"
    )
    for sub in (download, available):
        sub.add_argument(
            "--arch", help='target archs, e.g. "9.0a 10.0a" (default: as a module load has them)'
        )
    download.add_argument(
        "--ops", nargs="+", metavar="OP", help="only modules of these ops (default: every op)"
    )
    artifact_commands.add_parser("clear", help="remove the downloaded modules")
    artifacts.set_defaults(run=_artifacts)
    # The reference's names for the same commands.
    for name, sub_command in (
        ("download-cubin", "download"),
        ("list-cubins", "list"),
        ("clear-cubin", "clear"),
    ):
        alias = commands.add_parser(name, help=f"the same as `artifacts {sub_command}`")
        alias.set_defaults(run=_artifacts, artifacts_command=sub_command, arch=None, ops=None)

    doctor = commands.add_parser("doctor", help="check the toolchain, GPU and workspace")
    doctor.set_defaults(run=_doctor)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
