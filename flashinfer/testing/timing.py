"""GPU timing for benchmarks: medians of per-iteration device times.

``bench_gpu_time`` warms up, then times ``num_iters`` iterations, each preceded (outside
the timed region) by a write to a scratch buffer larger than the L2 cache so every
iteration starts cold. Timers:

- CUDA events around each iteration (default), queued behind a short GPU busy-wait so
  host overhead does not count;
- CUPTI kernel records (``enable_cupti=True`` with the ``cupti`` package importable):
  the span from the first kernel's start to the last kernel's end, which leaves out
  launch overhead before the first kernel; without the package it logs and uses events;
- with ``use_cuda_graph=True`` the iteration is one replay of a graph capturing ``fn``,
  which removes Python and launch overhead from either timer.
"""

from __future__ import annotations

import functools
import logging
import statistics
from typing import Any, Callable, Protocol, Sequence

import torch

logger = logging.getLogger("flashinfer.testing")


class IterationTimer(Protocol):
    """Times ``iterations`` calls of ``run``, calling ``prepare`` (untimed) before each;
    returns milliseconds per iteration."""

    def measure(
        self, run: Callable[[], Any], prepare: Callable[[], Any], iterations: int
    ) -> list[float]: ...


# GPU cycles of busy-wait queued ahead of each timed iteration (~100 us at 2 GHz).
_HOLD_CYCLES = 200_000


class CudaEventTimer:
    """Events around each iteration. A short GPU busy-wait is queued before the start event
    so the host's Python and launch overhead is hidden behind it: without it a small
    kernel's figure is the host's time between the two events, not the kernel's."""

    def measure(
        self, run: Callable[[], Any], prepare: Callable[[], Any], iterations: int
    ) -> list[float]:
        pairs = []
        for _ in range(iterations):
            prepare()
            torch.cuda._sleep(_HOLD_CYCLES)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in pairs]


class CuptiTimer:
    """Per-iteration span of the kernels (and copies) CUPTI saw start inside the iteration."""

    def measure(
        self, run: Callable[[], Any], prepare: Callable[[], Any], iterations: int
    ) -> list[float]:
        from cupti import cupti

        records: list[tuple[int, int]] = []

        def requested() -> tuple[int, int]:
            return 8 * 1024 * 1024, 0

        def completed(activities: list[Any]) -> None:
            records.extend((a.start, a.end) for a in activities)

        kinds = (
            cupti.ActivityKind.CONCURRENT_KERNEL,
            cupti.ActivityKind.MEMCPY,
            cupti.ActivityKind.MEMSET,
        )
        starts: list[int] = []
        cupti.activity_register_callbacks(requested, completed)
        try:
            for kind in kinds:
                cupti.activity_enable(kind)
            for _ in range(iterations):
                prepare()
                torch.cuda.synchronize()  # the flush's kernels end before this window opens
                starts.append(cupti.get_timestamp())
                run()
                torch.cuda.synchronize()
            starts.append(cupti.get_timestamp())
            cupti.activity_flush_all(1)
        finally:
            for kind in kinds:
                cupti.activity_disable(kind)
            cupti.finalize()
        times = []
        for begin, end in zip(starts, starts[1:]):
            inside = [(s, e) for s, e in records if begin <= s < end]
            if not inside:
                raise RuntimeError("CUPTI recorded no GPU activity in a timed iteration")
            times.append((max(e for _, e in inside) - min(s for s, _ in inside)) / 1e6)
        return times


def summarize(times_ms: Sequence[float]) -> tuple[float, float]:
    """(median, population standard deviation) of per-iteration times."""
    if not times_ms:
        raise ValueError("no timings to summarize")
    return statistics.median(times_ms), statistics.pstdev(times_ms)


@functools.cache
def _l2_flush_buffer(device_index: int) -> torch.Tensor:
    l2_bytes = getattr(torch.cuda.get_device_properties(device_index), "L2_cache_size", 0)
    size = max(2 * l2_bytes, 64 << 20)
    return torch.empty(size, dtype=torch.uint8, device=f"cuda:{device_index}")


def _cupti_available() -> bool:
    """Whether cupti-python imports (an installed but broken one, e.g. without its CUDA
    library, falls back to events here rather than failing after the warm-up)."""
    try:
        from cupti import cupti  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def choose_timer(enable_cupti: bool) -> IterationTimer:
    """CUPTI when asked for and importable, else CUDA events (saying so when asked)."""
    if enable_cupti and _cupti_available():
        return CuptiTimer()
    if enable_cupti:
        logger.info("bench_gpu_time: the cupti package is not importable; timing with CUDA events")
    return CudaEventTimer()


def bench_gpu_time(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    num_warmup: int = 10,
    num_iters: int = 100,
    enable_cupti: bool = False,
    l2_flush: bool = True,
    use_cuda_graph: bool = False,
    timer: IterationTimer | None = None,
) -> tuple[float, float]:
    """Median and standard deviation, in ms, of ``fn(*args, **kwargs)`` on the GPU.

    ``timer`` overrides the timer choice (tests pass a fake one)."""
    if num_iters < 1 or num_warmup < 0:
        raise ValueError("num_iters must be >= 1 and num_warmup >= 0")
    kwargs = kwargs or {}

    def call() -> Any:
        return fn(*args, **kwargs)

    timer = timer or choose_timer(enable_cupti)
    if l2_flush and torch.cuda.is_available():
        buffer = _l2_flush_buffer(torch.cuda.current_device())
        prepare: Callable[[], Any] = buffer.zero_
    else:

        def prepare() -> None:
            return None

    for _ in range(num_warmup):
        call()
    run = call
    if use_cuda_graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # capture-safe warm-up, as torch recommends
            call()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        run = graph.replay
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return summarize(timer.measure(run, prepare, num_iters))


def measure_copy_bandwidth(
    device: torch.device | str | int | None = None, size_bytes: int = 1 << 30
) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if device is None
        else (torch.device("cuda", device) if isinstance(device, int) else torch.device(device))
    )
    src = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    with torch.cuda.device(device):
        median_ms, _ = bench_gpu_time(dst.copy_, (src,), num_warmup=3, num_iters=20, l2_flush=False)
    return 2 * size_bytes / (median_ms * 1e-3) / 1e9
