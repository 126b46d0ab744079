"""The attention tests' output check: element-wise tolerances, and the error's norm relative
to the reference's.

Element-wise tolerances (an absolute term of 1e-2 to 2e-2) say little about outputs over
thousands of random keys, whose elements are a few hundredths: a kernel that drops a
cascade level or a KV chunk, or scales rows by 0.85, stays within them. The relative norm of
the error is some 0.003 for a correct bf16 output and tenths for those."""

from __future__ import annotations

import torch

RELATIVE_ERROR_BOUND = 2e-2


def relative_error(out: torch.Tensor, want: torch.Tensor) -> float:
    """||out - want|| / ||want|| over the elements where ``want`` is finite (0 where those
    are all 0: rows that see no key)."""
    finite = torch.isfinite(want)
    scale = want[finite].double().norm()
    if scale == 0:
        return 0.0
    return float((out.double() - want.double())[finite].norm() / scale)


def assert_output_close(
    out: torch.Tensor,
    want: torch.Tensor,
    *,
    equal_nan: bool = False,
    msg: str | None = None,
    **tolerance: float,
) -> None:
    """``out`` against the float64 reference ``want``: element by element within
    ``tolerance`` (atol, rtol; ``equal_nan``: NaN exactly where it is), then by the relative
    norm of its error."""
    torch.testing.assert_close(out.double(), want, equal_nan=equal_nan, msg=msg, **tolerance)
    error = relative_error(out, want)
    assert error < RELATIVE_ERROR_BOUND, (
        f"the output's error is {error:.4f} of the reference's norm (bound "
        f"{RELATIVE_ERROR_BOUND}): a dropped or misweighted part of the keys?"
    )
