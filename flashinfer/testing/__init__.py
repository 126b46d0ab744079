"""Tools for GPU tests and benchmarks: timing, copy bandwidth, torch references; `sass`
(imported on its own) reads compiled kernels' machine code without a GPU."""

from __future__ import annotations

from . import reference
from .timing import bench_gpu_time, measure_copy_bandwidth, summarize

__all__ = ["bench_gpu_time", "measure_copy_bandwidth", "reference", "summarize"]
