"""ArgumentBinder: which defaults a call leaves out (the log) and every argument by name (dumps)."""

from __future__ import annotations

from typing import Any

import pytest

from flashinfer.arguments import ArgumentBinder


def plain(a, b=2, /, c=3, *, d=4, e):  # noqa: ANN001, ANN201
    return None


def variadic(a, b=2, *rest, c=3, **extra):  # noqa: ANN001, ANN002, ANN003, ANN201
    return None


@pytest.mark.parametrize(
    "func,args,kwargs,left_out",
    [
        (plain, (1,), {"e": 5}, ["b", "c", "d"]),
        (plain, (1, 2), {"e": 5}, ["c", "d"]),  # passing a default's value still passes it
        (plain, (1, 2, 3), {"d": 0, "e": 5}, []),
        (plain, (1,), {"c": 0, "e": 5}, ["b", "d"]),
        (variadic, (1,), {}, ["b", "c"]),
        (variadic, (1, 2, 3, 4), {"x": 0}, ["c"]),
        (variadic, (1,), {"b": 0, "c": 0}, []),
    ],
)
def test_defaults_not_passed(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], left_out: list[str]
) -> None:
    found = ArgumentBinder(func).defaults_not_passed(args, kwargs)
    assert [name for name, _ in found] == left_out
    defaults = {"b": 2, "c": 3, "d": 4}
    assert all(value == defaults[name] for name, value in found)


def test_bind_names_every_parameter_with_the_defaults_applied() -> None:
    assert ArgumentBinder(plain).bind((1,), {"e": 5}) == [
        ("a", "POSITIONAL_ONLY", 1),
        ("b", "POSITIONAL_ONLY", 2),
        ("c", "POSITIONAL_OR_KEYWORD", 3),
        ("d", "KEYWORD_ONLY", 4),
        ("e", "KEYWORD_ONLY", 5),
    ]
    assert ArgumentBinder(variadic).bind((1, 2, 3), {"x": 9}) == [
        ("a", "POSITIONAL_OR_KEYWORD", 1),
        ("b", "POSITIONAL_OR_KEYWORD", 2),
        ("rest", "VAR_POSITIONAL", (3,)),
        ("c", "KEYWORD_ONLY", 3),
        ("extra", "VAR_KEYWORD", {"x": 9}),
    ]


def test_calls_that_do_not_bind_and_functions_without_a_signature() -> None:
    assert ArgumentBinder(plain).bind((1, 2, 3, 4), {"z": 0}) == [
        ("arg0", "POSITIONAL_ONLY", 1),
        ("arg1", "POSITIONAL_ONLY", 2),
        ("arg2", "POSITIONAL_ONLY", 3),
        ("arg3", "POSITIONAL_ONLY", 4),
        ("z", "KEYWORD_ONLY", 0),
    ]

    class NoSignature:
        @property
        def __signature__(self) -> Any:
            raise ValueError("no signature")

        def __call__(self, *args: Any, **kwargs: Any) -> None:
            return None

    binder = ArgumentBinder(NoSignature())
    assert binder.signature is None
    assert binder.bind((1,), {"k": 2}) == [("arg0", "POSITIONAL_ONLY", 1), ("k", "KEYWORD_ONLY", 2)]
    assert binder.defaults_not_passed((1,), {}) == []
