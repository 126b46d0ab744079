"""``from flashinfer.fi_trace import fi_trace``: the reference's module path for fi_trace.

``FLASHINFER_TRACE_DUMP`` / ``FLASHINFER_TRACE_DUMP_DIR`` are read through flashinfer.config;
the implementation is flashinfer/trace/api.py.
"""

from __future__ import annotations

from .trace.api import fi_trace

__all__ = ["fi_trace"]
