"""flashinfer.testing and flashinfer.utils (the benchmark CLI: test_benchmark_cli.py)."""

from __future__ import annotations

import logging
import statistics
import sys

import pytest
import torch

from flashinfer import testing, utils
from flashinfer.testing import timing
from flashinfer.utils import BackendNotSupportedError, backend_requirement


class FakeTimer:
    """Returns preset per-iteration times and records what bench_gpu_time asked for."""

    def __init__(self, times: list[float]) -> None:
        self.times = times
        self.calls: list[str] = []

    def measure(self, run, prepare, iterations):  # noqa: ANN001, ANN201
        self.calls.append(f"measure {iterations}")
        for _ in range(iterations):
            prepare()
            run()
        return self.times[:iterations]


# -- bench_gpu_time ------------------------------------------------------------------------


def test_summarize_is_median_and_population_std() -> None:
    assert testing.summarize([3.0, 1.0, 2.0, 10.0]) == (2.5, statistics.pstdev([1, 2, 3, 10]))
    with pytest.raises(ValueError):
        testing.summarize([])


def test_bench_gpu_time_warms_up_then_times_with_the_timer() -> None:
    calls = []
    timer = FakeTimer([1.0, 2.0, 4.0, 3.0, 100.0])

    def fn(a, b, *, c):  # noqa: ANN001, ANN202
        calls.append((a, b, c))

    median, std = testing.bench_gpu_time(
        fn, (1, 2), {"c": 3}, num_warmup=3, num_iters=5, l2_flush=False, timer=timer
    )
    assert (median, std) == (3.0, pytest.approx(statistics.pstdev([1, 2, 4, 3, 100])))
    assert calls == [(1, 2, 3)] * 8  # 3 warm-up calls, then 5 timed
    assert timer.calls == ["measure 5"]
    with pytest.raises(ValueError, match="num_iters"):
        testing.bench_gpu_time(fn, num_iters=0, timer=timer)


def test_cupti_counts_as_available_only_when_it_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cupti package that is installed but cannot load (its CUDA library missing) is not
    available, so bench_gpu_time times with events rather than failing after its warm-up."""
    import types

    working = types.ModuleType("cupti")
    working.cupti = types.ModuleType("cupti.cupti")
    monkeypatch.setitem(sys.modules, "cupti", working)
    assert timing._cupti_available()

    broken = types.ModuleType("cupti")

    def load(name: str) -> object:
        raise OSError("libcupti.so.13: cannot open shared object file")

    broken.__getattr__ = load  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupti", broken)
    assert not timing._cupti_available()
    monkeypatch.setitem(sys.modules, "cupti", None)  # not installed
    assert not timing._cupti_available()


def test_cupti_is_used_when_importable_and_falls_back_with_a_message(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(timing, "_cupti_available", lambda: True)
    assert isinstance(timing.choose_timer(True), timing.CuptiTimer)
    assert isinstance(timing.choose_timer(False), timing.CudaEventTimer)
    monkeypatch.setattr(timing, "_cupti_available", lambda: False)
    logger = logging.getLogger("flashinfer")
    monkeypatch.setattr(logger, "propagate", True)
    with caplog.at_level(logging.INFO, logger="flashinfer.testing"):
        assert isinstance(timing.choose_timer(True), timing.CudaEventTimer)
    assert "cupti package is not importable" in caplog.text


# -- arch helpers and backend_requirement ----------------------------------------------------


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):
    def set_gpu(capability: tuple[int, int], toolkit: tuple[int, int] | None) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(utils, "cuda_device_index", lambda device: 0)
        monkeypatch.setattr(utils, "_capability", lambda index: capability)
        monkeypatch.setattr(utils, "_toolkit_version", lambda: toolkit)

    return set_gpu


def test_nvcc_version_is_read_from_the_toolchain() -> None:
    version = utils.get_nvcc_version()
    assert version is not None and version >= (12, 0)


def test_toolkit_version_falls_back_to_torchs_without_nvcc(monkeypatch: pytest.MonkeyPatch) -> None:
    assert utils._toolkit_version() == utils.get_nvcc_version()
    monkeypatch.setattr(utils, "get_nvcc_version", lambda: None)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert utils._toolkit_version() == (12, 4)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert utils._toolkit_version() is None


ARCH_HELPERS = (
    "sm90a",
    "sm100a",
    "sm100f",
    "sm103a",
    "sm110a",
    "sm120a",
    "sm120f",
    "sm121a",
    "sm12x",
)


@pytest.mark.parametrize(
    "capability,toolkit,expected",
    [
        ((9, 0), (13, 0), {"sm90a"}),
        ((9, 0), (12, 3), {"sm90a"}),
        ((9, 0), (12, 2), set()),  # the device is there, the toolkit is too old
        ((10, 0), (12, 8), {"sm100a"}),
        ((10, 0), (12, 9), {"sm100a", "sm100f"}),
        ((10, 0), (12, 6), set()),
        ((10, 3), (12, 8), {"sm100a"}),
        ((10, 3), (12, 9), {"sm100a", "sm100f", "sm103a"}),
        ((11, 0), (13, 0), {"sm110a"}),
        ((11, 0), (12, 9), set()),
        ((12, 0), (12, 8), {"sm120a", "sm12x"}),
        ((12, 0), (13, 0), {"sm120a", "sm120f", "sm12x"}),
        ((12, 1), (12, 8), set()),
        ((12, 1), (12, 9), {"sm121a", "sm120f", "sm12x"}),
        ((8, 0), (13, 0), set()),
        ((9, 0), None, set()),  # no toolkit at all
    ],
)
def test_arch_helpers(fake_gpu, capability, toolkit, expected) -> None:
    fake_gpu(capability, toolkit)
    supported = {
        name
        for name in ARCH_HELPERS
        if getattr(utils, f"is_{name}_supported")(torch.device("cuda:0"))
    }
    assert supported == expected
    assert utils.get_compute_capability(0) == capability


def test_arch_helpers_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not utils.is_sm90a_supported("cuda") and not utils.is_sm100a_supported("cuda")


def test_device_helpers_take_a_device_in_any_form(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    class Properties:
        multi_processor_count = 132

    def properties(index: int) -> Properties:
        seen.append(index)
        return Properties()

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    utils._sm_count.cache_clear()
    try:
        assert utils.get_device_sm_count(torch.device("cuda", 1)) == 132
        assert utils.get_device_sm_count("cuda:2") == 132
        assert utils.get_device_sm_count("cuda") == 132
        assert utils.get_device_sm_count(1) == 132  # cached
    finally:
        utils._sm_count.cache_clear()
    assert seen == [1, 2, 3]
    with pytest.raises(ValueError, match="cpu is not a CUDA device"):
        utils.get_compute_capability(torch.device("cpu"))
    with pytest.raises(ValueError, match="cpu is not a CUDA device"):
        utils.get_device_sm_count("cpu")


def _api():  # noqa: ANN202
    @backend_requirement({"cuda": [80, (9, 0), 100], "cutlass": [(9, 0)]})
    def api(x: torch.Tensor, backend: str = "cuda") -> str:
        return f"ran with {backend}"

    return api


def test_backend_requirement_answers_support_questions() -> None:
    api = _api()
    assert api.is_compute_capability_supported(90) and api.is_compute_capability_supported((8, 0))
    assert not api.is_compute_capability_supported((7, 5))
    assert api.is_backend_supported("cutlass") and api.is_backend_supported("cutlass", (9, 0))
    assert not api.is_backend_supported("cutlass", 100)
    assert not api.is_backend_supported("triton")
    assert api.__name__ == "api"


def test_backend_requirement_refuses_before_running(
    fake_gpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_gpu((7, 5), (13, 0))
    monkeypatch.setattr(utils, "_cuda_device_of", lambda args, kwargs: torch.device("cuda", 0))
    api = _api()
    with pytest.raises(
        BackendNotSupportedError,
        match=r"backend 'cuda' does not support compute capability 7\.5 "
        r"\(cuda:0\); it supports 8\.0, 9\.0, 10\.0",
    ):
        api(torch.ones(1))
    with pytest.raises(BackendNotSupportedError, match="unknown backend 'triton'"):
        api(torch.ones(1), backend="triton")
    fake_gpu((9, 0), (13, 0))
    assert api(torch.ones(1), backend="cutlass") == "ran with cutlass"
    fake_gpu((10, 0), (13, 0))
    with pytest.raises(BackendNotSupportedError, match="backend 'cutlass'"):
        api(torch.ones(1), backend="cutlass")


def test_backend_requirement_ignores_cpu_tensors() -> None:
    assert _api()(torch.ones(1)) == "ran with cuda"


# -- GPU ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("use_cuda_graph", [False, True])
@pytest.mark.parametrize("enable_cupti", [False, True])
def test_bench_gpu_time_measures_a_known_kernel(use_cuda_graph: bool, enable_cupti: bool) -> None:
    from tests.debug.debug_module import debug_spec

    module = debug_spec().build_and_load()
    x = torch.zeros(1, device="cuda")
    for spin_us in (50, 400):
        median, std = testing.bench_gpu_time(
            module.spin,
            (x, spin_us * 1000),
            num_warmup=3,
            num_iters=30,
            use_cuda_graph=use_cuda_graph,
            enable_cupti=enable_cupti,
        )
        assert spin_us / 1000 * 0.98 <= median <= spin_us / 1000 * 1.10 + 0.01
        assert std < 0.1 * median + 0.005


@pytest.mark.gpu
def test_copy_bandwidth_is_positive_and_below_the_nominal_peak() -> None:
    name = torch.cuda.get_device_name()
    # Nominal HBM bandwidth, most specific names first; unknown devices get a loose bound.
    peaks_gbs = [
        ("H100 NVL", 3900.0),
        ("H100 PCIe", 2000.0),
        ("H100", 3350.0),
        ("H200", 4800.0),
        ("B200", 8000.0),
        ("A100", 2039.0),
    ]
    peak = next((gbs for key, gbs in peaks_gbs if key in name), 10_000.0)
    measured = testing.measure_copy_bandwidth()
    assert 0.2 * peak < measured < peak * 1.02, (name, measured)
