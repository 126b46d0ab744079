"""Quickstart demo: JIT-compile the RMSNorm module, then show both cache levels.

1. first call: compiles (or loads from the disk cache if an earlier run built it)
2. second call in this process: the in-memory cache
3. a fresh process: the disk cache, no compiler run
4. with a GPU: flashinfer.rmsnorm against a float32 torch reference
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

DEFAULT_ARCH = "9.0a"  # documented in README.md: the default for machines without a GPU


def _choose_arch() -> None:
    """Read the setting through flashinfer.config; without it and a GPU, set it (in the
    environment, so the child process below compiles for the same arch)."""
    from flashinfer.config import Config, config

    name = Config.cuda_arch_list.name
    if config.cuda_arch_list:
        print(f"target arch: {name}={config.cuda_arch_list}")
    elif torch.cuda.is_available():
        print(f"target arch: the visible GPU ({torch.cuda.get_device_name()})")
    else:
        os.environ[name] = DEFAULT_ARCH
        print(
            f"no GPU visible and {name} unset: compiling for {DEFAULT_ARCH} "
            f"(set {name} to choose others)"
        )


_CHILD = """
import time
import torch, flashinfer
start = time.perf_counter()
module = flashinfer.get_norm_module(torch.bfloat16)
print(f"{(time.perf_counter() - start) * 1e3:.2f}", module.dtype())
"""


def main() -> int:
    _choose_arch()
    import flashinfer
    from flashinfer.jit.norm import gen_norm_module

    spec = gen_norm_module(torch.bfloat16)
    stale = spec.is_stale
    print(f"module {spec.name}: {'needs a compile' if stale else 'found in the disk cache'}")
    print(f"  build dir: {spec.build_dir}")

    start = time.perf_counter()
    module = flashinfer.get_norm_module(torch.bfloat16)
    first = time.perf_counter() - start
    print(
        f"first call  : {first:8.3f} s   ({'compiled' if stale else 'disk cache'}; "
        f"module answers dtype() = {module.dtype()!r})"
    )

    start = time.perf_counter()
    flashinfer.get_norm_module(torch.bfloat16)
    print(f"second call : {(time.perf_counter() - start) * 1e6:8.2f} us  (in-memory cache)")

    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True
    )
    millis, dtype = proc.stdout.split()
    compiled_again = "compiling" in proc.stderr
    print(
        f"new process : {float(millis):8.2f} ms  (disk cache, "
        f"{'COMPILED AGAIN' if compiled_again else 'no compiler run'}; dtype() = {dtype!r})"
    )

    if torch.cuda.is_available():
        x = torch.randn(128, 4096, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
        y = flashinfer.rmsnorm(x, w, eps=1e-6)
        xf = x.float()
        ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        print(
            f"rmsnorm bf16 [128, 4096] max abs error vs float32 torch: "
            f"{(y.float() - ref).abs().max().item():.4g}"
        )
    else:
        print("no GPU: skipping the numerical check (the module was compiled and loaded)")
    return 1 if compiled_again else 0


if __name__ == "__main__":
    sys.exit(main())
