"""Programmatic dependent launch (PDL): the ``enable_pdl`` argument of kernel APIs.

With PDL a kernel may be scheduled while the previous kernel on the stream drains; it
waits (``griddepcontrol.wait``, see include/flashinfer/pdl.cuh) before touching memory
the previous kernel writes, so results do not change. Hopper (sm90) and newer only.
"""

from __future__ import annotations

from typing import Any

import torch

from .checks import check_optional_bool


def resolve_enable_pdl(enable_pdl: Any, device: torch.device) -> bool:
    """``enable_pdl`` as the reference takes it: ``None`` means on where the device has PDL
    (sm90+); ``True`` on an older device is off, as in the reference."""
    if check_optional_bool("enable_pdl", enable_pdl) is False or device.type != "cuda":
        return False
    from .utils import get_compute_capability

    return get_compute_capability(device)[0] >= 9
