"""Where the debugging tools write (FLASHINFER_LOGDEST): stdout, stderr or a file.

Also the one rule for the names of the files they create (:func:`safe_filename`).

A file path may contain ``%i``, replaced by the process id so each rank of a
multi-process job writes its own file. Parent directories are created; the file is
opened for append, line-buffered. Writers flush before each wrapped call runs, so
what was written survives a crash of the call (even SIGKILL: the data is in the OS).

Logging never breaks the call it describes: a destination that cannot be opened or
written (a directory, a path under /proc or under a regular file, no permission, a full
disk) is reported once, with the OS error, and everything goes to stderr from then on.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import TextIO

logger = logging.getLogger("flashinfer.logdest")

_reported: set[str] = set()  # destinations already reported unusable by this process


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_filename(name: str) -> str:
    """``name`` with every character other than letters, digits, ``_``, ``.`` and ``-``
    replaced by ``_``: no separator, so it stays within one path component."""
    return _UNSAFE.sub("_", name)


def resolve_path(spec: str) -> Path:
    return Path(spec.replace("%i", str(os.getpid()))).expanduser()


def warn_once(key: str, message: str) -> None:
    """Log ``message`` (one line) as a warning the first time ``key`` is seen in this process."""
    if key in _reported:
        return
    _reported.add(key)
    logger.warning("%s", " ".join(message.split("\n")))


class Destination:
    """A text sink resolved lazily from a FLASHINFER_LOGDEST-style spec."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._file: TextIO | None = None
        self._fallen_back = False
        self._lock = threading.Lock()

    def _stream(self) -> TextIO:
        if self._fallen_back or self.spec == "stderr":
            return sys.stderr
        if self.spec == "stdout":
            return sys.stdout  # looked up per write: pytest and users may swap it
        if self._file is None:
            path = resolve_path(self.spec)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives with the process
        return self._file

    def _fall_back(self, err: Exception) -> None:
        """From now on write to stderr; say so once per destination and process."""
        self._fallen_back = True
        if self._file is not None:
            try:
                self._file.close()
            except Exception:  # noqa: BLE001 - the file is being abandoned anyway
                pass
            self._file = None
        try:
            where = self.spec if self.spec == "stdout" else str(resolve_path(self.spec))
        except Exception:  # noqa: BLE001 - e.g. ~user of no such user: name the spec as given
            where = self.spec
        warn_once(
            f"logdest:{where}",
            f"cannot write the log to FLASHINFER_LOGDEST={where} "
            f"({type(err).__name__}: {err}); logging to stderr instead",
        )

    def write(self, text: str) -> None:
        """Write ``text`` (a newline is added if missing) and flush; never raises."""
        if not text.endswith("\n"):
            text += "\n"
        with self._lock:
            try:
                self._emit(self._stream(), text)
                return
            except Exception as err:  # noqa: BLE001 - logging must not break the call
                if self._fallen_back or self.spec == "stderr":
                    return  # stderr itself is unusable: nowhere left to write
                self._fall_back(err)
            try:
                self._emit(sys.stderr, text)
            except Exception:  # noqa: BLE001
                pass

    @staticmethod
    def _emit(stream: TextIO, text: str) -> None:
        stream.write(text)
        stream.flush()
