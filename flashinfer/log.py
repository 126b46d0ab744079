"""The ``flashinfer`` stdlib logger: INFO and above to stderr by default.

The level comes from ``FLASHINFER_LOGGING_LEVEL`` (INFO while it is invalid: the import
never fails on a setting; ``config.validate`` reports it at first use). Records do not
propagate to the root logger, so an application's own logging setup never prints them twice.
"""

from __future__ import annotations

import logging
import sys

from .config import config


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (pytest swaps it)."""

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # noqa: ANN001
        pass


def setup_logging() -> logging.Logger:
    logger = logging.getLogger("flashinfer")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[flashinfer] %(message)s"))
        logger.addHandler(handler)
    try:
        logger.setLevel(config.logging_level)
    except ValueError:
        logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger
