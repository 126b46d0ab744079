"""fi_trace: flashinfer-bench definitions of flashinfer API calls (see docs/debugging.md).

Every public API is decorated ``@flashinfer_api(trace=<TraceTemplate>)``; its templates live
in ``flashinfer/trace/templates/<family>.py``.
"""

from __future__ import annotations

from .api import ApiTrace, fi_trace
from .template import Const, Scalar, Tensor, TraceTemplate, Var

__all__ = ["ApiTrace", "Const", "Scalar", "Tensor", "TraceTemplate", "Var", "fi_trace"]
