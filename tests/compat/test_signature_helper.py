"""The signature comparison itself: it must notice every kind of difference."""

from __future__ import annotations

import pytest

from .signature import assert_signature


def _f(a, b=1, *, c=None, **kw):  # noqa: ANN001, ANN003, ANN202
    return a, b, c, kw


def test_identical_signature_passes() -> None:
    assert_signature(_f, "(a, b=1, *, c=None, **kw)")


@pytest.mark.parametrize(
    "reference",
    [
        "(a, b=2, *, c=None, **kw)",  # default
        "(a, b=1, c=None, **kw)",  # keyword-only marker
        "(a, x=1, *, c=None, **kw)",  # name
        "(a, *, c=None, b=1, **kw)",  # order and kind
        "(a, b=1, *, c=None)",  # missing **kwargs
        "(a, b=1, *, c=None, d=0, **kw)",  # missing parameter
    ],
)
def test_each_difference_fails(reference: str) -> None:
    with pytest.raises(AssertionError, match="differs from the reference"):
        assert_signature(_f, reference)
