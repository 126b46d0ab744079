"""Bad input under faults (issue 16, items 2 and 7): indptr-like arguments that once
corrupted the heap, and None for a required sampling filter."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import flashinfer
from tests.conftest import REPO_ROOT

HEAP_CASES = """
import torch, flashinfer
i32 = lambda v: torch.tensor(v, dtype=torch.int32)
cases = [
    ("get_batch_indices_positions", lambda: flashinfer.get_batch_indices_positions(
        i32([0, 4096, 2]), i32([4096, 2]), 2)),
    ("apply_rope", lambda: flashinfer.apply_rope(
        torch.randn(2, 4, 64, dtype=torch.half), torch.randn(2, 1, 64, dtype=torch.half),
        i32([0, 4096, 2]), i32([0, 0]))),
    ("apply_llama31_rope", lambda: flashinfer.apply_llama31_rope(
        torch.randn(2, 4, 64, dtype=torch.half), torch.randn(2, 1, 64, dtype=torch.half),
        i32([0, 4096, 2]), i32([0, 0]))),
]
for name, call in cases:
    try:
        call()
        print(name, "accepted")
    except ValueError as err:
        print(name, "raised:", err)
"""


def test_non_monotone_indptrs_raise_in_five_fresh_processes() -> None:
    """torch's repeat_interleave(output_size=...) trusts its input: before the shared
    indptr check, these aborted with 'free(): invalid next size' in some runs."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HEAP_CASES],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        for _ in range(5)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        lines = out.splitlines()
        assert len(lines) == 3, out
        for line in lines:
            assert "raised: " in line and "indptr must be non-decreasing" in line, line


P = torch.rand(2, 16).softmax(-1)


@pytest.mark.parametrize(
    "api,args,param",
    [
        (flashinfer.top_p_sampling_from_probs, (P, None), "top_p"),
        (flashinfer.top_k_sampling_from_probs, (P, None), "top_k"),
        (flashinfer.min_p_sampling_from_probs, (P, None), "min_p"),
        (flashinfer.top_k_renorm_probs, (P, None), "top_k"),
        (flashinfer.top_p_renorm_probs, (P, None), "top_p"),
    ],
)
def test_none_for_a_required_filter_is_a_type_error_naming_it(api, args, param: str) -> None:
    with pytest.raises(TypeError, match=f"^{param} must be"):
        api(*args)


def test_errors_name_a_parameter_of_the_function_called() -> None:
    q, k = torch.randn(4, 2, 64), torch.randn(4, 1, 64)
    with pytest.raises(TypeError, match="^pos_ids must be a torch.Tensor"):
        flashinfer.apply_rope_pos_ids(q, k, None)
