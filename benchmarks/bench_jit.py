"""JIT benchmark (CPU): cold compile, warm load and in-memory hit of the RMSNorm module,
each as a ratio against a reference measured in the same run.

- cold compile vs the bare compiler commands of the same build (framework overhead)
- cold compile vs the same code as ONE nvcc translation unit (binding + kernel together)
- warm load in a fresh process vs tvm_ffi.cpp.load (warm) of that single-TU source,
  and vs a bare tvm_ffi.load_module of the built .so (the floor)
- in-memory hit of get_norm_module()

Usage: python benchmarks/bench_jit.py [--repeats N] [--output benchmarks/results/jit.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
from report import cpu_description, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ARCH = "9.0a"


def _env(workspace: Path) -> dict[str, str]:
    return dict(
        os.environ,
        FLASHINFER_WORKSPACE_BASE=str(workspace),
        FLASHINFER_CUDA_ARCH_LIST=os.environ.get("FLASHINFER_CUDA_ARCH_LIST", ARCH),
        TVM_FFI_CUDA_ARCH_LIST=os.environ.get("FLASHINFER_CUDA_ARCH_LIST", ARCH),
        PYTHONWARNINGS="ignore",
    )


def _python(code: str, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    return proc.stdout.strip()


_COLD = """
import time, torch
from flashinfer.jit.norm import gen_norm_module
spec = gen_norm_module(torch.bfloat16)
start = time.perf_counter()
spec.build_and_load()
print(time.perf_counter() - start, spec.build_dir)
"""

_WARM_FLASHINFER = """
import time, torch, flashinfer
start = time.perf_counter()
flashinfer.get_norm_module(torch.bfloat16).rmsnorm
print(time.perf_counter() - start)
"""

_WARM_TVM_FFI = """
import time, torch, tvm_ffi, tvm_ffi.cpp
start = time.perf_counter()
tvm_ffi.cpp.load({name!r}, cuda_files=[{source!r}], extra_cuda_cflags={flags!r},
                 extra_include_paths={includes!r}, build_directory={build!r}).rmsnorm
print(time.perf_counter() - start)
"""

_BARE_LOAD = """
import time, torch, tvm_ffi
start = time.perf_counter()
tvm_ffi.load_module({so!r}).rmsnorm
print(time.perf_counter() - start)
"""


def _timed_commands(groups: list[list[str]]) -> float:
    """Run each group's commands in parallel, groups in order; return wall seconds."""
    start = time.perf_counter()
    for group in groups:
        procs = [subprocess.Popen(cmd, shell=True) for cmd in group]
        if any(p.wait() != 0 for p in procs):
            raise RuntimeError(f"command failed in {group}")
    return time.perf_counter() - start


def _bare_commands(build_dir: Path, scratch: Path) -> list[list[str]]:
    """The build's compile commands (parallel) then its link, writing into ``scratch``."""
    from flashinfer.jit.toolchain import find_ninja

    out = subprocess.run(
        [str(find_ninja()), "-C", str(build_dir), "-t", "commands"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    compiles = [c for c in out if " -c " in c]
    links = [c for c in out if " -c " not in c]
    scratch.mkdir(parents=True, exist_ok=True)
    rebase = lambda cmd: f"cd {shlex.quote(str(scratch))} && {cmd}"  # noqa: E731
    return [[rebase(c) for c in compiles], [rebase(c) for c in links]]


def _single_tu(scratch: Path, spec_plan) -> tuple[Path, list[str], list[str]]:  # noqa: ANN001
    """The norm module's two TUs as one nvcc TU, the way most JIT frameworks build."""
    from flashinfer.jit import env

    scratch.mkdir(parents=True, exist_ok=True)
    source = scratch / "norm_single.cu"
    source.write_text(
        f'#include "{env.FLASHINFER_CSRC_DIR / "norm_kernel.cu"}"\n'
        f'#include "{env.FLASHINFER_CSRC_DIR / "norm.cc"}"\n'
    )
    tc = spec_plan.toolchain
    includes = [
        str(env.FLASHINFER_INCLUDE_DIR),
        str(env.FLASHINFER_CSRC_DIR),
        str(env.generated_dir("norm_dtype_bf16")),
    ]
    flags = [f for f in spec_plan.ninja.cuda_cflags if not f.startswith("-I")]
    tvm_includes = [f"-I{p}" for p in tc.tvm_ffi_include_dirs]
    return source, flags, includes + [p[2:] for p in tvm_includes]


def _median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per warm figure")
    parser.add_argument("--cold-repeats", type=int, default=3, help="cold builds per figure")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/jit.md")
    args = parser.parse_args()

    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-jit-") as tmp_name:
        tmp = Path(tmp_name)

        cold, bare, single = [], [], []
        build_dir = None
        for i in range(args.cold_repeats):
            env = _env(tmp / f"ws-cold-{i}")
            seconds, build_dir_text = _python(_COLD, env).split()
            cold.append(float(seconds))
            build_dir = Path(build_dir_text)
            bare.append(_timed_commands(_bare_commands(build_dir, tmp / f"bare-{i}")))

        os.environ.update(_env(tmp / "ws-cold-0"))
        from flashinfer.jit.norm import gen_norm_module

        plan = gen_norm_module(torch.bfloat16).plan()
        source, flags, includes = _single_tu(tmp / "single", plan)
        tc = plan.toolchain
        for i in range(args.cold_repeats):
            obj = tmp / "single" / f"single{i}.o"
            so = tmp / "single" / f"single{i}.so"
            nvcc = [str(tc.nvcc), *flags, *(f"-I{p}" for p in includes), "-c", str(source),
                    "-o", str(obj)]
            link = [str(tc.cxx), str(obj), *plan.ninja.ldflags, "-o", str(so)]
            single.append(_timed_commands([[shlex.join(nvcc)], [shlex.join(link)]]))

        cold_m, bare_m, single_m = _median(cold), _median(bare), _median(single)
        rows += [
            ("cold compile, flashinfer (2 TUs in parallel + link)", f"{cold_m:.2f} s", ""),
            ("cold compile, bare compiler commands of the same build", f"{bare_m:.2f} s",
             f"framework overhead x{cold_m / bare_m:.2f}"),
            ("cold compile, same code as one nvcc TU", f"{single_m:.2f} s",
             f"flashinfer is x{single_m / cold_m:.2f} faster"),
        ]

        warm_env = _env(tmp / "ws-cold-0")
        # tvm-ffi finds CUDA from nvcc's path; here nvcc is a wrapper script in /usr/local/bin.
        warm_env["CUDA_HOME"] = str(tc.cuda_home)
        warm = [float(_python(_WARM_FLASHINFER, warm_env)) for _ in range(args.repeats)]
        tvm_code = _WARM_TVM_FFI.format(
            name="norm_single", source=str(source),
            flags=[f for f in flags if not f.startswith("-gencode")], includes=includes,
            build=str(tmp / "tvm-ffi-build"),
        )
        _python(tvm_code, warm_env)  # cold build of the peer, not timed
        peer = [float(_python(tvm_code, warm_env)) for _ in range(args.repeats)]
        so = str(build_dir / "norm_dtype_bf16.so") if build_dir else ""
        floor = [float(_python(_BARE_LOAD.format(so=so), warm_env)) for _ in range(args.repeats)]
        warm_m, peer_m, floor_m = _median(warm), _median(peer), _median(floor)
        rows += [
            ("warm load in a fresh process, flashinfer.get_norm_module", f"{warm_m * 1e3:.2f} ms",
             f"x{peer_m / warm_m:.1f} faster than tvm_ffi.cpp.load"),
            ("warm load in a fresh process, tvm_ffi.cpp.load (single TU)", f"{peer_m * 1e3:.2f} ms",
             "runs ninja in every process"),
            ("bare tvm_ffi.load_module of the built .so (floor)", f"{floor_m * 1e3:.2f} ms",
             f"flashinfer adds {max(warm_m - floor_m, 0) * 1e3:.2f} ms"),
        ]

        import flashinfer

        flashinfer.get_norm_module(torch.bfloat16)
        n = 200_000
        hit = min(timeit.repeat(lambda: flashinfer.get_norm_module(torch.bfloat16),
                                number=n, repeat=5)) / n
        rows.append(("in-memory hit, get_norm_module(torch.bfloat16)", f"{hit * 1e9:.0f} ns", ""))

    write_report(
        args.output,
        "JIT benchmark (CPU)",
        [
            f"date: {datetime.date.today().isoformat()}",
            f"machine: {cpu_description()}, no GPU; target arch {ARCH}",
            f"nvcc: {tc.nvcc_version()}; host compiler: {tc.cxx_version()}",
            f"tvm-ffi {tc.tvm_ffi_version}, torch {torch.__version__}, "
            f"Python {platform.python_version()}",
            f"medians: {args.cold_repeats} cold builds, {args.repeats} fresh processes per "
            "warm figure",
            "command: `python benchmarks/bench_jit.py`",
        ],
        ["what", "time", "ratio / note"],
        "lrl",
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
