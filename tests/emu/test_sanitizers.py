"""Emulated kernels under AddressSanitizer and UndefinedBehaviorSanitizer
(tests/emu/sanitizers.py): faults the emulator cannot see are reported, and a selection of
the emulated modules' tests runs clean."""

from __future__ import annotations

import pytest

from tests.emu import sanitizers
from tests.emu.faults import Fault

pytestmark = pytest.mark.skipif(
    sanitizers.runtime() is None, reason="the host compiler has no AddressSanitizer runtime"
)

# One module of each kernel family (a build each, about 17 s instrumented), on the cases that
# reach its edges: partial tiles, padding rows, split KV and its merge, page ids outside the
# cache, page tables shorter than their indptr, strided and in-place rows, crowded sampling
# bins and 64-bit indices. `python -m tests.emu.sanitizers` runs every emulated test.
SELECTION = (
    "tests/emu/test_simt.py::test_a_well_behaved_kernel_runs",
    *(
        f"tests/ops/test_{test}"
        for test in (
            "prefill_emulated.py::test_batch_paged_on_every_tiling[hd128-m1kv64]",
            "prefill_emulated.py::test_batch_ragged_custom_mask_on_every_tiling[hd128-m1kv64]",
            "prefill_emulated.py::test_long_kv_is_split_over_ctas_and_merged",
            "prefill_emulated.py::test_out_of_range_page_ids_are_skipped_not_scored[True]",
            "decode_emulated.py::test_batch_decode_matches_the_reference[33x1-hd128-p8-NHD-bfloat16]",
            "decode_emulated.py::test_split_chunks_with_unscored_pages_merge_to_the_reference[128-3]",
            "page_emulated.py::test_out_of_range_indices_are_skipped_not_written",
            "page_emulated.py::test_page_table_entries_past_kv_indices_are_never_read",
            "cascade_emulated.py::test_merge_state_matches_the_softmax_merge_formula[dtype2]",
            "norm_emulated.py::test_every_norm_in_every_row_layout_matches_the_reference"
            "[bfloat16-2x4097+1]",
            "activation_emulated.py::test_strided_3d_output_leaves_its_neighbours_untouched",
            "rope_emulated.py::test_ragged_batches_and_llama31[True]",
            "rope_emulated.py::test_cos_sin_cache_and_out_of_range_positions[True]",
            "sampling_emulated.py::test_crowded_histogram_bins_select_exact_sets[1-4099]",
            "sampling_emulated.py::test_wide_indices_and_top_k_are_not_narrowed",
        )
    ),
)


def _fault(fault: Fault, offset: int) -> tuple[int, str]:
    result = sanitizers.run_python(
        [
            "-c",
            "from tests.emu.faults import Fault, launch_fault; "
            f"launch_fault(Fault.{fault.name}, {offset})",
        ],
        timeout=300,
    )
    return result.returncode, result.stderr


# fault: (offset, what the report says)
REPORTS = {
    # src is 1024 bytes: thread 0 of each CTA reads the byte after it
    Fault.LOAD_PAST_BUFFER: (1024, "heap-buffer-overflow"),
    # a static __shared__ array of 64 bytes: thread 0 reads byte 64 + 8
    Fault.LOAD_PAST_STATIC_SHARED: (72, "index 72 out of bounds for type 'unsigned char [64]'"),
    # block 0: INT_MAX + 1
    Fault.SIGNED_OVERFLOW: (1, "signed integer overflow"),
}


@pytest.mark.parametrize("fault", REPORTS, ids=lambda fault: fault.name.lower())
def test_faults_the_emulator_cannot_see_fail_under_sanitizers(fault: Fault) -> None:
    offset, report = REPORTS[fault]
    returncode, stderr = _fault(fault, offset)
    assert returncode != 0 and report in stderr, stderr[-3000:]
    assert "faults.cu" in stderr  # the report names the kernel's line


def test_a_report_inside_a_pytest_run_is_shown(tmp_path) -> None:
    """A fault in a test that pytest runs: the report reaches stderr before the process ends
    (pytest's default capture of file descriptor 2 swallowed it, leaving exit status 1)."""
    test = tmp_path / "test_fault.py"
    test.write_text(
        "from tests.emu.faults import Fault, launch_fault\n\n\n"
        "def test_fault():\n"
        "    launch_fault(Fault.SIGNED_OVERFLOW, 1)\n"
    )
    command = sanitizers.pytest_command(["-q", "-p", "no:cacheprovider", str(test)])
    assert command[:3] == ["-m", "pytest", "--capture=sys"] and command[-1] == str(test)
    result = sanitizers.run_python(command, timeout=300)
    assert result.returncode != 0 and "signed integer overflow" in result.stderr, result.stderr
    assert "--capture=sys" not in sanitizers.pytest_command(["-s", str(test)])
    assert sanitizers.pytest_command(["-x"])[-len(sanitizers.EVERY_EMULATED_TEST) :] == list(
        sanitizers.EVERY_EMULATED_TEST
    )


def test_emulated_modules_run_clean_under_sanitizers() -> None:
    result = sanitizers.run_python(
        sanitizers.pytest_command(["-q", "-x", "-p", "no:cacheprovider", *SELECTION]),
        timeout=1500,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert f"{len(SELECTION)} passed" in result.stdout, output[-3000:]
