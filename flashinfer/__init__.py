"""flashinfer: LLM-serving CUDA kernels, JIT-compiled per specialization and cached."""

from __future__ import annotations

import tvm_ffi as _tvm_ffi  # noqa: F401 - loads modules; imported here so first calls stay fast

from .log import setup_logging as _setup_logging
from .version import __version__

_setup_logging()

from .api_logging import flashinfer_api  # noqa: E402
from .norm import get_norm_module, rmsnorm  # noqa: E402

__all__ = ["__version__", "flashinfer_api", "get_norm_module", "rmsnorm"]
