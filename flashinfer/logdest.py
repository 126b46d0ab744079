"""Where the debugging tools write (FLASHINFER_LOGDEST): stdout, stderr or a file.

A file path may contain ``%i``, replaced by the process id so each rank of a
multi-process job writes its own file. Parent directories are created; the file is
opened for append, line-buffered. Writers flush before each wrapped call runs, so
what was written survives a crash of the call (even SIGKILL: the data is in the OS).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import TextIO


def resolve_path(spec: str) -> Path:
    return Path(spec.replace("%i", str(os.getpid()))).expanduser()


class Destination:
    """A text sink resolved lazily from a FLASHINFER_LOGDEST-style spec."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._file: TextIO | None = None
        self._lock = threading.Lock()

    def _stream(self) -> TextIO:
        if self.spec == "stdout":
            return sys.stdout  # looked up per write: pytest and users may swap it
        if self.spec == "stderr":
            return sys.stderr
        if self._file is None:
            path = resolve_path(self.spec)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives with the process
        return self._file

    def write(self, text: str) -> None:
        """Write ``text`` (a newline is added if missing) and flush."""
        if not text.endswith("\n"):
            text += "\n"
        with self._lock:
            stream = self._stream()
            stream.write(text)
            stream.flush()
