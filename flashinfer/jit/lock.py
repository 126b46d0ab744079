"""One file lock per module, so concurrent processes compile a module once.

``filelock`` uses ``fcntl.flock`` on POSIX: the kernel releases a lock when its
holder dies, so a lock left by a killed process never blocks a later one.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator

from filelock import FileLock, Timeout

from . import env

logger = logging.getLogger("flashinfer.jit")

_WAIT_REPORT_S = 1.0


@contextlib.contextmanager
def module_lock(uri: str) -> Iterator[None]:
    path = env.lock_path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=_WAIT_REPORT_S)
    except Timeout:
        start = time.monotonic()
        logger.info("waiting for another process to finish building %s (lock %s)", uri, path)
        lock.acquire()
        logger.info("lock for %s acquired after %.1f s", uri, time.monotonic() - start)
    try:
        yield
    finally:
        lock.release()
