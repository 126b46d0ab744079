"""benchmarks/flashinfer_benchmark.py (the developer guide's benchmark CLI), its routines
and the per-family benchmark scripts.

On the CPU: argument parsing as documented, --testlist into one CSV, the routine registry,
and every routine's torch backends run end to end on small CPU tensors (with a stand-in
timer) through --refcheck against its float64 reference or check, which tests the
references and checks the GPU runs rely on. The flashinfer backends are run on a GPU only;
on the CPU their calls are shown to bind to the APIs' signatures. Reference read for the
CLI's flags, CSV columns and [PERF] line: flashinfer-ai/flashinfer
benchmarks/flashinfer_benchmark.py @ 00c6ba87b4426f9882c8b9f67f33c06dc724cf15 and
benchmarks/routines/{attention,norm,sampling,rope}.py.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import inspect
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import flashinfer
from tests.conftest import REPO_ROOT, run_python

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import flashinfer_benchmark as cli  # noqa: E402
import routines  # noqa: E402
from routines import sampling as sampling_routines  # noqa: E402

CPU = torch.device("cpu")

DOCUMENTED = [
    "--routine",
    "BatchDecodeWithPagedKVCacheWrapper",
    "--backends",
    "fa2",
    "cudnn",
    "--batch_size",
    "32",
    "--s_kv",
    "2048",
    "--num_qo_heads",
    "32",
    "--num_kv_heads",
    "8",
    "--head_dim_qk",
    "128",
    "--head_dim_vo",
    "128",
    "--page_size",
    "16",
    "--refcheck",
    "-vv",
]

# small shapes per family, for CPU runs (and the GPU smoke tests)
SMALL = {
    "attention": [
        "--batch_size",
        "2",
        "--s_qo",
        "3",
        "--s_kv",
        "37",
        "--num_qo_heads",
        "4",
        "--num_kv_heads",
        "2",
        "--head_dim_qk",
        "64",
        "--page_size",
        "8",
        "--shared_kv_len",
        "13",
    ],
    "norm": ["--batch_size", "5", "--hidden_size", "64"],
    "activation": ["--batch_size", "5", "--hidden_size", "64"],
    "rope": [
        "--batch_size",
        "2",
        "--seq_len",
        "7",
        "--num_qo_heads",
        "4",
        "--num_kv_heads",
        "2",
        "--head_dim",
        "64",
        "--rotary_dim",
        "32",
    ],
    "page": [
        "--batch_size",
        "3",
        "--seq_len",
        "37",
        "--num_kv_heads",
        "2",
        "--head_dim",
        "64",
        "--page_size",
        "8",
    ],
    "cascade": ["--seq_len", "9", "--num_heads", "4", "--head_dim", "64", "--num_states", "3"],
    "sampling": ["--batch_size", "4", "--vocab_size", "1000", "--logits_scale", "3"],
}
ONE_QUERY = {
    "BatchDecodeWithPagedKVCacheWrapper": ["--s_qo", "1"],
    "single_decode_with_kv_cache": ["--batch_size", "1", "--s_qo", "1"],
    "single_prefill_with_kv_cache": ["--batch_size", "1"],
}
TORCH_SIDE = ("torch", "flash", "cudnn")


class WallTimer:
    """Stands in for the CUDA-event timer on CPU tensors."""

    def measure(self, run, prepare, iterations):  # noqa: ANN001, ANN201
        times = []
        for _ in range(iterations):
            prepare()
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) * 1e3)
        return times


CPU_RUN = dict(timer=WallTimer(), bandwidth=lambda device: 100.0)


def small_argv(routine: str, backends: list[str], *extra: str) -> list[str]:
    family = routines.ROUTINES[routine].family.name
    return [
        "--routine",
        routine,
        "--backends",
        *backends,
        "--num_iters",
        "1",
        "--dry_run_iters",
        "0",
        *SMALL[family],
        *ONE_QUERY.get(routine, []),
        *extra,
    ]


def torch_side(routine: str) -> list[str]:
    return [b for b in routines.ROUTINES[routine].backends if b in TORCH_SIDE]


# -- arguments -----------------------------------------------------------------------------------


def test_the_documented_command_parses() -> None:
    args = cli.parse_args([*DOCUMENTED, "--s_qo", "1", "--causal", "--output_path", "r.csv"])
    assert args.routine == "BatchDecodeWithPagedKVCacheWrapper"
    assert args.backends == ["fa2", "cudnn"]
    assert (args.batch_size, args.s_qo, args.s_kv) == (32, 1, 2048)
    assert (args.num_qo_heads, args.num_kv_heads, args.head_dim_qk, args.head_dim_vo) == (
        32,
        8,
        128,
        128,
    )
    assert args.page_size == 16 and args.causal and args.refcheck and args.verbose == 2
    assert args.output_path == "r.csv"
    # the reference's defaults: 30 timed iterations after 5 dry runs, CUPTI unless told
    assert (args.num_iters, args.dry_run_iters, args.use_cupti) == (30, 5, True)
    assert args.q_dtype == args.kv_dtype == torch.bfloat16 and args.kv_layout == "NHD"


def test_dashed_aliases_and_the_reference_backend_alias() -> None:
    args = cli.parse_args(
        [
            "--routine",
            "rmsnorm",
            "--backends",
            "cuda",
            "torch",
            "fa2",
            "--batch-size",
            "3",
            "--hidden-size",
            "64",
            "--dtype",
            "fp16",
            "--output-csv",
            "out.csv",
            "--num-iters",
            "7",
            "--num-warmup",
            "2",
            "--use-cuda-graph",
            "--no-l2-flush",
            "--use_cuda_events",
            "-v",
        ]
    )
    assert args.backends == ["fa2", "torch"]  # cuda is the reference's name for ours
    assert (args.batch_size, args.hidden_size, args.input_dtype) == (3, 64, torch.float16)
    assert (args.output_path, args.num_iters, args.dry_run_iters) == ("out.csv", 7, 2)
    assert args.use_cuda_graph and not args.no_cuda_graph and args.no_l2_flush
    assert not args.use_cupti and args.verbose == 1
    old = cli.parse_args(
        [
            "--routine",
            "BatchPrefillWithPagedKVCacheWrapper",
            "--qo-len",
            "64",
            "--kv-len",
            "128",
            "--head-dim",
            "64",
            "--num-qo-heads",
            "8",
            "--num-kv-heads",
            "2",
            "--page-size",
            "4",
            "--kv-layout",
            "HND",
        ]
    )
    assert (old.s_qo, old.s_kv, old.head_dim_qk, old.head_dim_vo) == (64, 128, 64, 64)
    assert (old.num_qo_heads, old.num_kv_heads, old.page_size, old.kv_layout) == (8, 2, 4, "HND")


def test_defaults_resolved_by_the_family() -> None:
    single = cli.parse_args(["--routine", "single_prefill_with_kv_cache", "--s_qo", "16"])
    assert single.batch_size == 1 and single.backends == ["fa2"]
    batch = cli.parse_args(["--routine", "BatchPrefillWithRaggedKVCacheWrapper"])
    assert batch.batch_size == 16
    rope = cli.parse_args(["--routine", "apply_rope", "--head_dim", "64"])
    assert rope.rotary_dim == 64


def test_deprecated_cupti_flag_warns(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.parse_args(["--routine", "softmax", "--use_cupti"]).use_cupti
    assert "--use_cupti is deprecated" in capsys.readouterr().out


def test_enable_pdl_warns_for_apis_without_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.parse_args(["--routine", "rmsnorm", "--enable_pdl"]).enable_pdl
    assert "ignored" not in capsys.readouterr().out
    cli.parse_args(["--routine", "layernorm", "--enable_pdl"])
    assert "layernorm takes no enable_pdl" in capsys.readouterr().out


def test_generate_repro_command() -> None:
    args = cli.parse_args(["--routine", "rmsnorm", "--batch_size", "3", "--generate_repro_command"])
    assert args.repro_command == (
        "python3 flashinfer_benchmark.py --routine rmsnorm --batch_size 3 --generate_repro_command"
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--routine", "nope"], "invalid choice"),
        ([], "--routine"),
        (["--routine", "rmsnorm", "--dtype", "int3"], "unknown dtype 'int3'"),
        (["--routine", "rmsnorm", "--backends", "fa3"], "invalid choice: 'fa3'"),
        (["--routine", "rmsnorm", "--backends", "cudnn"], "invalid choice: 'cudnn'"),
        (
            ["--routine", "BatchPrefillWithPagedKVCacheWrapper", "--head_dim_qk", "96"],
            "--head_dim_qk/--head-dim-qk/--head-dim: invalid choice: 96",
        ),
        (
            ["--routine", "BatchPrefillWithPagedKVCacheWrapper", "--head_dim_vo", "64"],
            "--head_dim_vo must equal --head_dim_qk",
        ),
        (
            ["--routine", "single_prefill_with_kv_cache", "--head_dim_qk", "192"],
            "--head_dim_vo must equal --head_dim_qk (64, 128, 256), or be 128 with",
        ),
        (
            [
                *("--routine", "BatchPrefillWithPagedKVCacheWrapper"),
                *("--head_dim_qk", "192", "--head_dim_vo", "128"),
            ],
            "--head_dim_qk 192: only BatchPrefillWithRaggedKVCacheWrapper, single_prefill",
        ),
        (
            ["--routine", "BatchPrefillWithPagedKVCacheWrapper", "--kv_dtype", "float16"],
            "--kv_dtype must equal --q_dtype, or be fp8",
        ),
        (
            ["--routine", "BatchPrefillWithPagedKVCacheWrapper", "--s_qo", "4096"],
            "--s_qo must be <= --s_kv",
        ),
        (
            ["--routine", "BatchDecodeWithPagedKVCacheWrapper", "--s_qo", "2"],
            "one query token per request",
        ),
        (["--routine", "single_decode_with_kv_cache", "--batch_size", "2"], "--batch_size 1"),
        (
            ["--routine", "BatchPrefillWithPagedKVCacheWrapper", "--num_kv_heads", "0"],
            "--num_kv_heads must be >= 1",
        ),
        (
            [
                "--routine",
                "BatchPrefillWithPagedKVCacheWrapper",
                "--num_qo_heads",
                "6",
                "--num_kv_heads",
                "4",
            ],
            "must be a multiple of --num_kv_heads",
        ),
        (["--routine", "apply_rope", "--rotary_dim", "7"], "--rotary_dim must be even"),
        (["--routine", "top_p_sampling_from_probs", "--top_p", "0"], "--top_p must be in (0, 1]"),
        (["--routine", "softmax", "--temperature", "0"], "--temperature must be > 0"),
        (["--routine", "rmsnorm_quant", "--scale", "-1"], "--scale must be > 0"),
    ],
)
def test_argument_errors_name_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_routine_help_lists_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--routine", "BatchDecodeWithPagedKVCacheWrapper", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(
        f in out
        for f in ("--s_kv", "--head_dim_qk", "--backends", "--testlist", "--output_path", "fa2_tc")
    )


# -- the registry -----------------------------------------------------------------------------

FAMILIES = {
    "attention": {
        "BatchDecodeWithPagedKVCacheWrapper",
        "BatchPrefillWithPagedKVCacheWrapper",
        "BatchPrefillWithRaggedKVCacheWrapper",
        "single_decode_with_kv_cache",
        "single_prefill_with_kv_cache",
        "MultiLevelCascadeAttentionWrapper",
    },
    "norm": {
        "rmsnorm",
        "gemma_rmsnorm",
        "fused_add_rmsnorm",
        "gemma_fused_add_rmsnorm",
        "rmsnorm_quant",
        "fused_add_rmsnorm_quant",
        "layernorm",
    },
    "activation": {"silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"},
    "rope": {"apply_rope", "apply_rope_pos_ids", "apply_llama31_rope_pos_ids"},
    "page": {"append_paged_kv_cache"},
    "cascade": {"merge_state", "merge_states"},
    "sampling": {
        "softmax",
        "sampling_from_probs",
        "sampling_from_logits",
        "top_k_sampling_from_probs",
        "top_p_sampling_from_probs",
        "min_p_sampling_from_probs",
        "top_k_top_p_sampling_from_probs",
        "top_k_top_p_sampling_from_logits",
        "top_k_renorm_probs",
        "top_p_renorm_probs",
        "top_k_mask_logits",
    },
}


def test_every_family_has_its_routines() -> None:
    found: dict[str, set[str]] = {}
    for name, routine in routines.ROUTINES.items():
        found.setdefault(routine.family.name, set()).add(name)
    assert found == FAMILIES
    with pytest.raises(ValueError, match="registered twice"):
        routines.register(routines.ROUTINES["rmsnorm"])


@pytest.mark.parametrize("name", sorted(routines.ROUTINES))
def test_routines_name_public_apis_and_offer_ours_and_torch(name: str) -> None:
    routine = routines.ROUTINES[name]
    assert hasattr(flashinfer, name)
    assert routine.backends[0] == "fa2" and "torch" in routine.backends
    if routine.family.name == "attention":
        assert {"cudnn", "flash"} <= set(routine.backends)
    assert set(routine.family.columns) <= set(cli.csv_columns())


def test_csv_columns_start_with_the_references() -> None:
    columns = cli.csv_columns()
    assert columns[:7] == [
        "routine",
        "median_time",
        "std_time",
        "tflops",
        "tb_per_sec",
        "backend",
        "resolved_backend",
    ]
    assert len(columns) == len(set(columns))
    assert {
        "s_qo",
        "s_kv",
        "head_dim_qk",
        "head_dim_vo",
        "causal",
        "vocab_size",
        "refcheck",
        "case_tag",
        "repro_command",
        "case",
        "copy_bw_fraction",
    } <= set(columns)


def test_perf_line_is_the_references() -> None:
    assert cli.perf_line("fa2", 0.01234, 0.0004, 1.5, 2.8904) == (
        "[PERF] fa2            :: median time 0.012 ms; std 0.000 ms; achieved tflops 1.500 "
        "TFLOPs/sec; achieved tb_per_sec 2.890 TB/sec"
    )


# -- routines on CPU: the torch backends against the references -----------------------------------


@pytest.mark.parametrize("name", sorted(routines.ROUTINES))
def test_torch_backends_pass_refcheck_on_cpu(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.parse_args([*small_argv(name, torch_side(name)), "--refcheck", "-v"])
    rows = cli.run_routine(args, CPU, **CPU_RUN)
    out = capsys.readouterr().out
    assert "[INFO] refcheck passed" in out
    ran = [row["backend"] for row in rows]
    assert "torch" in ran
    if "cudnn" in args.backends and "cudnn" not in ran:  # CPU tensors: no cuDNN kernel
        assert "[INFO] cudnn backend skipped: torch SDPA has no cudnn kernel" in out
    for row in rows:
        assert row["routine"] == name and row["median_time"] > 0 and row["case"]
        assert row["resolved_backend"] == row["backend"]
        assert row["tb_per_sec"] > 0 and row["copy_bw_fraction"] > 0
    assert out.count("[PERF] ") == len(rows)


@pytest.mark.parametrize(
    "name,extra",
    [
        ("BatchPrefillWithPagedKVCacheWrapper", ["--causal", "--kv_layout", "HND"]),
        ("BatchPrefillWithPagedKVCacheWrapper", ["--causal", "--torch_gather", "untimed"]),
        ("BatchPrefillWithRaggedKVCacheWrapper", ["--causal", "--kv_layout", "HND"]),
        ("single_prefill_with_kv_cache", ["--causal", "--kv_layout", "HND"]),
        ("BatchDecodeWithPagedKVCacheWrapper", ["--kv_layout", "HND", "--num_kv_heads", "4"]),
        ("BatchDecodeWithPagedKVCacheWrapper", ["--kv_dtype", "float8_e4m3fn"]),
        ("single_decode_with_kv_cache", ["--kv_dtype", "e5m2", "--kv_layout", "HND"]),
        ("BatchPrefillWithPagedKVCacheWrapper", ["--causal", "--kv_dtype", "e4m3"]),
        ("BatchPrefillWithRaggedKVCacheWrapper", ["--kv_dtype", "e5m2"]),
        ("single_prefill_with_kv_cache", ["--causal", "--kv_dtype", "e4m3"]),
        ("BatchPrefillWithRaggedKVCacheWrapper", ["--head_dim_qk", "192", "--head_dim_vo", "128"]),
        (
            "single_prefill_with_kv_cache",
            ["--causal", "--head_dim_qk", "192", "--head_dim_vo", "128", "--kv_layout", "HND"],
        ),
        ("MultiLevelCascadeAttentionWrapper", ["--causal", "--kv_layout", "HND"]),
        ("apply_rope_pos_ids", ["--interleave"]),
        (
            "apply_llama31_rope_pos_ids",
            ["--rope_scale", "8", "--rope_theta", "5e5", "--old_context_len", "4"],
        ),
        ("append_paged_kv_cache", ["--kv_layout", "HND"]),
        ("rmsnorm", ["--num_heads", "3", "--dtype", "float16"]),
        ("merge_states", ["--input_dtype", "float32"]),
        ("top_k_top_p_sampling_from_probs", ["--filter_apply_order", "joint"]),
        ("top_k_mask_logits", ["--input_dtype", "bfloat16"]),
    ],
)
def test_torch_backends_pass_refcheck_in_other_forms(name: str, extra: list[str]) -> None:
    args = cli.parse_args([*small_argv(name, ["torch"], *extra), "--refcheck"])
    assert [row["backend"] for row in cli.run_routine(args, CPU, **CPU_RUN)] == ["torch"]


def test_an_fp8_cache_counts_one_byte_a_kv_element() -> None:
    """--kv_dtype e4m3: the case names the cache's dtype and its bytes count one byte a KV
    element."""
    name = "BatchDecodeWithPagedKVCacheWrapper"
    args = cli.parse_args(small_argv(name, ["torch"], "--kv_dtype", "e4m3"))
    rows = cli.run_routine(args, CPU, **CPU_RUN)
    assert [row["backend"] for row in rows] == ["torch"]
    assert "kv float8_e4m3fn" in rows[0]["case"]
    fp8 = routines.ROUTINES[name].make_case(args, CPU).bytes
    half = routines.ROUTINES[name].make_case(cli.parse_args(small_argv(name, ["torch"])), CPU).bytes
    q_bytes = 2 * args.batch_size * args.num_qo_heads * args.head_dim_qk * 2
    assert (half - q_bytes) == 2 * (fp8 - q_bytes)


@pytest.mark.parametrize(
    "name", ["BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"]
)
def test_kv_data_is_drawn_in_the_query_dtype(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A case's K/V (a paged cache, or ragged K and V) is drawn in the 16-bit query dtype and
    only then cast to the cache's: bench_decode's 256 x 32k cache is 32 GiB in bf16, and a
    float32 draw beside it (64 GiB more) does not fit in an 80 GB GPU."""
    drawn: list[torch.dtype | None] = []
    randn = torch.randn

    def recording_randn(*args: Any, **kwargs: Any) -> torch.Tensor:
        drawn.append(kwargs.get("dtype"))
        return randn(*args, **kwargs)

    monkeypatch.setattr(torch, "randn", recording_randn)
    for kv in ([], ["--kv_dtype", "e4m3"]):
        args = cli.parse_args(small_argv(name, ["torch"], *kv))
        routines.ROUTINES[name].make_case(args, CPU)
    assert drawn and set(drawn) == {torch.bfloat16}, drawn


def test_attention_flops_count_the_visible_pairs() -> None:
    full = routines.ROUTINES["BatchPrefillWithRaggedKVCacheWrapper"].make_case(
        cli.parse_args(small_argv("BatchPrefillWithRaggedKVCacheWrapper", ["torch"])), CPU
    )
    causal = routines.ROUTINES["BatchPrefillWithRaggedKVCacheWrapper"].make_case(
        cli.parse_args(small_argv("BatchPrefillWithRaggedKVCacheWrapper", ["torch"], "--causal")),
        CPU,
    )
    # 2 requests, 4 heads, head_dim 64; 3 queries over 37 keys: rows see 35, 36, 37 keys
    assert full.flops == 4 * 2 * (3 * 37) * 4 * 64
    assert causal.flops == 4 * 2 * (35 + 36 + 37) * 4 * 64
    assert full.bytes == (2 * 2 * 3 * 4 * 64 + 2 * 2 * 37 * 2 * 64) * 2
    mla = routines.ROUTINES["BatchPrefillWithRaggedKVCacheWrapper"].make_case(
        cli.parse_args(
            small_argv(
                "BatchPrefillWithRaggedKVCacheWrapper",
                ["torch"],
                *("--head_dim_qk", "192", "--head_dim_vo", "128"),
            )
        ),
        CPU,
    )
    # q.k over 192 dims, p.v over 128; q and k rows of 192, v and output rows of 128
    assert mla.flops == 2 * 2 * (3 * 37) * 4 * (192 + 128)
    assert mla.bytes == (2 * 3 * 4 * (192 + 128) + 2 * 37 * 2 * (192 + 128)) * 2
    assert "d192/128" in mla.label


# -- the flashinfer backends: their calls bind to the APIs ---------------------------------------


def _bind(function: Any, *args: Any, **kwargs: Any) -> None:
    inspect.signature(function).bind(*args, **kwargs)


def _signature_checked(cls: type) -> type:
    """A stand-in for a wrapper class whose methods only bind their arguments to the real
    ones (decode's plan() forwards keywords to _plan_impl: those are bound there too)."""

    class Stand:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _bind(cls.__init__, self, *args, **kwargs)

        def plan(self, *args: Any, **kwargs: Any) -> None:
            _bind(cls.plan, self, *args, **kwargs)
            if hasattr(cls, "_plan_impl"):
                _bind(cls._plan_impl, self, *args, **kwargs)

        def run(self, *args: Any, **kwargs: Any) -> str:
            _bind(cls.run, self, *args, **kwargs)
            return "ran"

    return Stand


WRAPPERS = {
    "BatchDecodeWithPagedKVCacheWrapper": "decode",
    "BatchPrefillWithPagedKVCacheWrapper": "prefill",
    "BatchPrefillWithRaggedKVCacheWrapper": "prefill",
    "MultiLevelCascadeAttentionWrapper": "cascade",
}


@pytest.mark.parametrize("name", sorted(routines.ROUTINES))
def test_our_backends_call_the_apis_as_they_are_declared(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a GPU a flashinfer call stops at the device check, after its arguments were
    bound and checked; a wrapper is replaced by one that binds every call."""
    routine = routines.ROUTINES[name]
    ours = [b for b in routine.backends if b not in TORCH_SIDE]
    for class_name, module_name in WRAPPERS.items():
        module = importlib.import_module(f"flashinfer.{module_name}")
        monkeypatch.setattr(module, class_name, _signature_checked(getattr(module, class_name)))
    case = routine.make_case(cli.parse_args(small_argv(name, ours)), CPU)
    assert list(case.backends) == ours
    for backend in case.backends.values():
        if name in WRAPPERS:
            assert backend.call() == "ran"
        else:
            with pytest.raises(ValueError, match="must be a CUDA tensor"):
                backend.call()


# -- refcheck --------------------------------------------------------------------------------------


def test_count_mismatches() -> None:
    expected = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    actual = torch.tensor([1.0, 2.05, float("nan"), 4.0], dtype=torch.bfloat16)
    assert cli.count_mismatches(actual, expected, atol=1e-2, rtol=1e-2) == (2, 4)
    with pytest.raises(ValueError, match="shape"):
        cli.count_mismatches(actual[:3], expected, atol=1e-2, rtol=1e-2)


def _case(outputs: dict[str, torch.Tensor], **fields: Any) -> routines.Case:
    backends = {name: routines.Backend(lambda out=out: out) for name, out in outputs.items()}
    return routines.Case("tiny", backends, bytes=16, **fields)


def test_refcheck_against_the_reference_then_across_backends() -> None:
    good, bad = torch.ones(4), torch.tensor([1.0, 1.0, 5.0, 1.0])
    outputs = {"fa2": good, "torch": bad}
    problems = cli.refcheck(_case(outputs, reference=lambda: torch.ones(4).double()), outputs)
    assert problems == [
        "Output tensor mismatch between backends reference (float64) and torch: "
        "1 / 4 (25.00%) elements are different"
    ]
    problems = cli.refcheck(_case(outputs), outputs)  # no reference: the first backend's
    assert problems == [
        "Output tensor mismatch between backends fa2 and torch: 1 / 4 (25.00%) "
        "elements are different"
    ]
    assert cli.refcheck(_case({"fa2": good, "torch": good}), {"fa2": good, "torch": good}) == []


def test_refcheck_with_a_check() -> None:
    outputs = {"fa2": torch.tensor([0, 1]), "torch": torch.tensor([0, 7])}
    case = _case(outputs, check=lambda out: routines.count_bad(out > 3))
    assert cli.refcheck(case, outputs) == [
        "Backend torch fails the routine's check: 1 / 2 (50.00%) elements are wrong"
    ]


@pytest.fixture
def broken_routine(monkeypatch: pytest.MonkeyPatch) -> str:
    """A routine whose torch backend is off by one in one element."""

    def make_case(args: argparse.Namespace, device: torch.device) -> routines.Case:
        x = torch.arange(8.0)
        wrong = x.clone()
        wrong[3] += 1
        return routines.Case(
            "8",
            routines.build(
                args.backends,
                {
                    "fa2": lambda: routines.Backend(lambda: x),
                    "torch": lambda: routines.Backend(lambda: wrong),
                },
            ),
            bytes=64,
            reference=lambda: x.double(),
        )

    base = routines.ROUTINES["silu_and_mul"]
    monkeypatch.setitem(
        routines.ROUTINES,
        "broken",
        routines.Routine("broken", base.family, "test", ("fa2", "torch"), make_case),
    )
    return "broken"


@pytest.fixture
def crashing_routine(monkeypatch: pytest.MonkeyPatch) -> str:
    def make_case(args: argparse.Namespace, device: torch.device) -> routines.Case:
        raise RuntimeError("kernel failed")

    base = routines.ROUTINES["silu_and_mul"]
    monkeypatch.setitem(
        routines.ROUTINES,
        "crashing",
        routines.Routine("crashing", base.family, "test", ("fa2", "torch"), make_case),
    )
    return "crashing"


def test_a_refcheck_failure_stops_the_case(
    broken_routine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cli.parse_args(
        [
            "--routine",
            broken_routine,
            "--backends",
            "fa2",
            "torch",
            "--refcheck",
            "--num_iters",
            "1",
        ]
    )
    with pytest.raises(cli.RefcheckFailed, match="backends reference \\(float64\\) and torch"):
        cli.run_routine(args, CPU, **CPU_RUN)
    assert "[ERROR] Output tensor mismatch" in capsys.readouterr().out
    args.allow_output_mismatch = True
    assert [row["backend"] for row in cli.run_routine(args, CPU, **CPU_RUN)] == ["fa2", "torch"]


def test_token_check_flags_tokens_outside_the_set() -> None:
    allowed = torch.tensor([[True, False, True], [False, True, False]])
    check = sampling_routines._token_check(lambda: allowed)
    assert check(torch.tensor([0, 1])) == (0, 2)
    assert check(torch.tensor([1, 1])) == (1, 2)
    assert check(torch.tensor([2, 3])) == (1, 2)  # out of range
    assert check(torch.tensor([-1, 0])) == (2, 2)


def test_filter_check_flags_wrong_sets_and_values() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    loose = lambda: torch.tensor([[True, True, True, False]])  # noqa: E731
    tight = lambda: torch.tensor([[True, True, False, False]])  # noqa: E731
    check = sampling_routines._filter_check(
        probs,
        loose,
        tight,
        0.0,
        lambda kept: (
            torch.where(kept, probs.double(), 0.0) / torch.where(kept, probs.double(), 0.0).sum()
        ),
    )
    assert check(torch.tensor([[0.625, 0.375, 0.0, 0.0]])) == (0, 4)
    assert check(torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95) == (0, 4)  # the free token
    assert check(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))[0] == 1  # a required token dropped
    assert check(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))[0] == 1  # an excluded one kept
    assert check(torch.tensor([[0.7, 0.3, 0.0, 0.0]]))[0] == 2  # wrong values


def test_sampling_checks_reject_tokens_below_the_cut() -> None:
    args = cli.parse_args(small_argv("top_k_sampling_from_probs", ["torch"], "--top_k", "5"))
    torch.manual_seed(0)
    case = routines.ROUTINES["top_k_sampling_from_probs"].make_case(args, CPU)
    torch.manual_seed(0)  # the case's probabilities, drawn again
    probs = torch.softmax(torch.randn(4, 1000) * 3, dim=-1)
    assert case.check(case.backends["torch"].call()) == (0, 4)
    assert case.check(probs.argmax(dim=-1)) == (0, 4)
    assert case.check(probs.argmin(dim=-1)) == (4, 4)


# -- command lines and testlists --------------------------------------------------------------


def test_without_a_gpu_it_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(DOCUMENTED) == 0
    out = capsys.readouterr().out
    assert "no CUDA GPU visible" in out and "[SKIPPED] --routine BatchDecode" in out


TESTLIST = """\
# one routine a line; the CSV gets them all
--routine rmsnorm --backends torch --batch_size 5 --hidden_size 64 --refcheck
--routine BatchDecodeWithPagedKVCacheWrapper --backends torch flash {attention} --s_qo 1

--routine top_k_top_p_sampling_from_logits --backends torch --batch_size 4 --vocab_size 500 \
--case_tag tagged
"""


def _testlist(tmp_path: Path, extra_line: str = "") -> Path:
    path = tmp_path / "cases.txt"
    path.write_text(TESTLIST.format(attention=" ".join(SMALL["attention"])) + extra_line)
    return path


def test_testlist_without_a_gpu_skips_every_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    output = tmp_path / "results.csv"
    assert cli.main(["--testlist", str(_testlist(tmp_path)), "--output_path", str(output)]) == 0
    out = capsys.readouterr().out
    assert "no CUDA GPU visible" in out and out.count("[SKIPPED] --routine") == 3
    assert list(csv.reader(output.open())) == [cli.csv_columns()]  # the header, no rows
    bad = _testlist(tmp_path, "--routine rmsnorm --hidden_size x\n")
    assert cli.main(["--testlist", str(bad)]) == 2  # a line that does not parse
    captured = capsys.readouterr()
    assert "[ERROR] Cannot parse test: --routine rmsnorm --hidden_size x" in captured.out
    assert "invalid int value: 'x'" in captured.err


def test_testlist_runs_each_line_into_one_csv(
    tmp_path: Path, broken_routine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = cli.read_testlist(
        str(_testlist(tmp_path, f"--routine {broken_routine} --backends torch --refcheck\n"))
    )
    assert len(lines) == 4 and lines[2].endswith("--case_tag tagged")
    output = tmp_path / "results.csv"
    cases = [(line, cli.parse_args(shlex.split(line))) for line in lines]
    status = cli.run_cases(cases, str(output), CPU, keep_going=True, **CPU_RUN)
    assert status == 1  # the broken line failed; the others ran
    assert "[ERROR] Refcheck failed: --routine broken" in capsys.readouterr().out
    header, *rows = list(csv.reader(output.open()))
    assert header == cli.csv_columns()
    table = [dict(zip(header, row)) for row in rows]
    assert [(r["routine"], r["backend"]) for r in table] == [
        ("rmsnorm", "torch"),
        ("BatchDecodeWithPagedKVCacheWrapper", "torch"),
        ("BatchDecodeWithPagedKVCacheWrapper", "flash"),
        ("top_k_top_p_sampling_from_logits", "torch"),
    ]
    norm, decode, _, sampled = table
    assert (norm["batch_size"], norm["hidden_size"], norm["input_dtype"]) == (
        "5",
        "64",
        "torch.bfloat16",
    )
    assert norm["refcheck"] == "True" and norm["s_kv"] == "" and norm["vocab_size"] == ""
    assert (decode["s_qo"], decode["s_kv"], decode["page_size"]) == ("1", "37", "8")
    assert decode["q_dtype"] == "torch.bfloat16" and decode["hidden_size"] == ""
    assert (sampled["vocab_size"], sampled["case_tag"]) == ("500", "tagged")
    assert all(float(r["median_time"]) > 0 and r["case"] for r in table)


def test_a_crash_stops_a_single_command_but_not_a_testlist(
    crashing_routine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    case = [("line", cli.parse_args(["--routine", crashing_routine, "--backends", "torch"]))]
    with pytest.raises(RuntimeError, match="kernel failed"):
        cli.run_cases(case, None, CPU, keep_going=False, **CPU_RUN)
    assert cli.run_cases(case, None, CPU, keep_going=True, **CPU_RUN) == 1
    assert "[ERROR] Error: kernel failed" in capsys.readouterr().out


# -- the per-family scripts --------------------------------------------------------------------

GPU_BENCH_SCRIPTS = [
    ("bench_family.py", "norm"),
    ("bench_family.py", "activation"),
    ("bench_family.py", "rope"),
    ("bench_family.py", "page"),
    ("bench_sampling.py",),
    ("bench_decode.py",),
    ("bench_prefill.py",),
]


def _run_bench(script: str, *args: str):  # noqa: ANN202 - CompletedProcess
    """benchmarks/<script> with ``args`` in a fresh interpreter, from benchmarks/."""
    argv = [script, *args]
    return run_python(
        f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path({script!r}, run_name='__main__')",
        cwd=REPO_ROOT / "benchmarks",
        check=False,
    )


@pytest.mark.parametrize("script", GPU_BENCH_SCRIPTS, ids=" ".join)
def test_gpu_bench_scripts_without_a_gpu_say_so(script: tuple[str, ...], tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    output = tmp_path / "results.md"
    proc = _run_bench(*script, "--output", str(output))
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA GPU visible" in proc.stdout and not output.exists()


def test_bench_prefill_swaps_the_tiling_in_and_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """--tilings: inside kernel_tiling, flashinfer.prefill builds its modules with that
    tiling (once per build: dtype, head dims, position encoding, KV dtype) and re-reads its
    CTAs per device; after it, the configured modules are back. The stand-in takes the
    parameters of the function it replaces, which the library passes by position (until
    session 36 it lacked head_dim_vo, and every plan() under --tilings would have raised)."""
    import bench_prefill

    from flashinfer import prefill as api
    from flashinfer.jit.prefill import PrefillTiling

    built: list[tuple[Any, ...]] = []

    class Spec:
        def __init__(
            self,
            dtype: Any,
            head_dim: int,
            tiling: PrefillTiling,
            pos_encoding: str = "NONE",
            kv_dtype: Any = None,
            head_dim_vo: int | None = None,
        ) -> None:
            built.append((dtype, head_dim, tiling, pos_encoding, kv_dtype, head_dim_vo))

        def build_and_load(self) -> str:
            return f"module {built[-1][2].name}"

    monkeypatch.setattr(bench_prefill, "gen_prefill_module", Spec)
    original = api.get_prefill_module
    tiling = PrefillTiling(2, 32)
    with bench_prefill.kernel_tiling(tiling):
        swapped = inspect.signature(api.get_prefill_module).parameters
        assert list(swapped) == list(inspect.signature(original).parameters)
        assert api.get_prefill_module(torch.bfloat16, 128) == "module m2kv32"
        assert api.get_prefill_module(torch.bfloat16, 128) == "module m2kv32"
        fp8 = torch.float8_e4m3fn
        assert api.get_prefill_module(torch.bfloat16, 128, "NONE", fp8) == "module m2kv32"
        assert api.get_prefill_module(torch.bfloat16, 192, "NONE", None, 128) == "module m2kv32"
        assert api._max_ctas.cache_info().currsize == 0
    assert built == [
        (torch.bfloat16, 128, tiling, "NONE", None, None),
        (torch.bfloat16, 128, tiling, "NONE", fp8, None),
        (torch.bfloat16, 192, tiling, "NONE", None, 128),
    ]
    assert api.get_prefill_module is original
    names = [t.name for t in bench_prefill.parse_tilings("all", 256)]
    assert names == ["m1kv16", "m1kv16p", "m1kv32", "m1kv32p", "m1kv64"]
    assert bench_prefill.parse_tilings("m1kv16c2", 128) == [PrefillTiling(1, 16, 2)]
    with pytest.raises(SystemExit, match="m2kv16 at head_dim 256 needs 272 accumulators"):
        bench_prefill.parse_tilings("m2kv16", 256)
    with pytest.raises(SystemExit, match="'2x32' is not m<tiles>kv<tokens>\\[c<ctas>\\]"):
        bench_prefill.parse_tilings("2x32", 128)


def test_decode_probe_asks_for_the_occupancy_as_plan_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_probe's call of flashinfer.decode._max_ctas binds to its parameters (it lacked
    the position encoding and KV dtype added after it was written, a TypeError on the GPU)."""
    import decode_probe

    from flashinfer import decode as api

    class Bound(Exception):
        pass

    declared = inspect.signature(api._max_ctas.__wrapped__)

    def max_ctas(*args: Any, **kwargs: Any) -> int:
        raise Bound(declared.bind(*args, **kwargs))

    monkeypatch.setattr(api, "_max_ctas", max_ctas)
    monkeypatch.setattr(decode_probe, "script_args", lambda *a, **k: argparse.Namespace(iters=1))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(Bound) as bound:
        decode_probe.main([])
    arguments = bound.value.args[0].arguments
    assert (arguments["pos_encoding"], arguments["kv_dtype"]) == ("NONE", torch.bfloat16)


def test_the_profiling_driver_without_a_gpu_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    proc = _run_bench("prefill_profile.py")
    assert proc.returncode == 0 and "no CUDA GPU visible" in proc.stdout, proc.stderr


def test_bench_family_needs_a_family(capsys: pytest.CaptureFixture[str]) -> None:
    import bench_family

    with pytest.raises(SystemExit):
        bench_family.main(["nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


@pytest.fixture
def fake_gpu_measure(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """The scripts on CPU: a visible 'GPU', and measure() that parses the routine's command
    line as flashinfer_benchmark would (so bad flags fail) and returns fixed timings."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    seen: list[argparse.Namespace] = []

    def measure(
        routine: str, flags: list[str], backends=("fa2", "torch"), num_iters=100, num_warmup=10
    ):  # noqa: ANN001, ANN202
        seen.append(cli.parse_args(["--routine", routine, "--backends", *backends, *flags]))
        return {
            b: {
                "backend": b,
                "median_time": 0.01 * (i + 1),
                "tb_per_sec": 2.0,
                "copy_bw_fraction": 0.66,
                "tflops": 300.0 / (i + 1),
                "case": "shape",
            }
            for i, b in enumerate(backends)
        }

    for module in ("bench_family", "bench_decode", "bench_sampling", "bench_prefill"):
        monkeypatch.setattr(importlib.import_module(module), "measure", measure)
    monkeypatch.setattr(importlib.import_module("bench_decode"), "copy_bandwidth", lambda: 3000.0)
    return seen


@pytest.mark.parametrize(
    "script,argv,rows",
    [
        ("bench_family", ["norm"], 4 * 2 * 6),
        ("bench_family", ["rope", "--quick"], 1),
        ("bench_family", ["page"], 10),
        ("bench_family", ["activation"], 30),
        ("bench_decode", [], 12),
        ("bench_decode", ["--kv_dtype", "float8_e5m2"], 12),
        ("bench_sampling", [], 12 + 9),
        ("bench_prefill", [], 2),
        ("bench_prefill", ["--probe"], 5),
        ("bench_prefill", ["--tilings", "m1kv64,m2kv32"], 4),
        ("bench_prefill", ["--head_dim", "64", "--tilings", "all"], 2 * 12),
        ("bench_prefill", ["--kv_dtype", "float8_e4m3fn", "--tilings", "all"], 2 * 11),
    ],
)
def test_bench_scripts_write_their_tables(
    script: str,
    argv: list[str],
    rows: int,
    fake_gpu_measure,
    tmp_path: Path,  # noqa: ANN001
    capsys: pytest.CaptureFixture[str],
) -> None:
    output = tmp_path / "table.md"
    assert importlib.import_module(script).main([*argv, "--output", str(output)]) == 0
    text = output.read_text()
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 2 + rows and len(fake_gpu_measure) == rows
    assert "- device: NVIDIA H100 80GB HBM3" in text and "- command: `python benchmarks/" in text
    assert all("| x2.0" in line for line in table[2:])  # torch's fixed time: twice ours
    capsys.readouterr()


@pytest.mark.parametrize(
    "script,argv",
    [
        ("bench_family", ["norm", "--quick"]),
        ("bench_decode", ["--quick"]),
        ("bench_sampling", ["--quick"]),
        ("bench_prefill", ["--probe"]),
    ],
)
def test_a_failing_case_costs_its_row_not_the_table(
    script: str,
    argv: list[str],
    fake_gpu_measure,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A case that raises (a refcheck, an out-of-memory error) becomes an error row with the
    table's columns; the other rows are measured, the table is written, the script exits 1
    and the traceback goes to stderr."""
    module = importlib.import_module(script)
    measure = module.measure
    calls = []

    def failing_second(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory | tried to allocate 32.00 GiB\nmore")
        return measure(*args, **kwargs)

    monkeypatch.setattr(module, "measure", failing_second)
    output = tmp_path / "table.md"
    assert module.main([*argv, "--output", str(output)]) == 1
    table = [line for line in output.read_text().splitlines() if line.startswith("| ")]
    assert len(table) == 2 + len(calls) and len(calls) >= 2
    failed = [line for line in table if "error: " in line]
    assert len(failed) == 1 and "error: RuntimeError: CUDA out of memory / tried" in failed[0]
    assert "more" not in failed[0] and failed[0].count(" | ") == table[0].count(" | ")
    assert "RuntimeError" in capsys.readouterr().err


def test_a_tilings_run_cut_off_leaves_the_tilings_it_measured(
    fake_gpu_measure,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The table is written after each tiling (marked partial, with the fastest so far), so
    a run its time limit kills (here an interrupt in the second tiling's second case) leaves
    the first tiling's rows; no half-written file."""
    import bench_prefill

    measure = bench_prefill.measure
    calls = []

    def killed_in_the_fourth(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return measure(*args, **kwargs)

    monkeypatch.setattr(bench_prefill, "measure", killed_in_the_fourth)
    output = tmp_path / "table.md"
    with pytest.raises(KeyboardInterrupt):
        bench_prefill.main(["--tilings", "m1kv64,m2kv32,m1kv32", "--output", str(output)])
    text = output.read_text()
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 2 + 2 and all(line.startswith("| m1kv64 |") for line in table[2:])
    assert "- partial: 1 of 3 tilings measured so far" in text
    assert f"- {bench_prefill.FASTEST_FACT}: m1kv64" in text
    assert [p.name for p in tmp_path.iterdir()] == ["table.md"]
    assert "| m1kv64 |" not in capsys.readouterr().out  # partial tables are not printed
    assert bench_prefill.main(["--tilings", "m1kv64,m2kv32", "--output", str(output)]) == 0
    assert "partial" not in output.read_text()


def test_a_tiling_with_a_failed_target_case_is_not_the_fastest() -> None:
    import bench_prefill
    from gpu_script import guarded

    def failing() -> tuple[str, ...]:
        raise RuntimeError("refcheck")

    width = len(bench_prefill.HEADER)
    ok = ("m1kv64", "r", "c", "1", "1", "1%", "1", "1", "x0.90")
    table = [
        ok,
        ok,
        ("m2kv32", *ok[1:-1], "x2.00"),
        guarded(("m2kv32", "batch"), width, failing),
    ]
    assert bench_prefill.fastest(table, 2) == ("m1kv64", pytest.approx(0.9))
    assert bench_prefill.fastest(table[2:], 2) is None


def test_bench_prefill_names_the_fastest_tiling_and_runs_it(
    fake_gpu_measure,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--tilings names the tiling with the best geometric mean of the single and batch paged
    speedups (probe rows do not count); --tilings fastest:FILE then runs that one alone, and
    refuses a table of another head_dim or one without the line."""
    import bench_prefill

    # measure() calls, per tiling: single, batch paged, then the 3 probe rows. m1kv64 wins
    # the single case by most, m2kv32 the geometric mean; m1kv32 wins only a probe row.
    ours_ms = {
        "m1kv32": [2.0, 2.0, 0.1, 0.1, 0.1],
        "m1kv64": [0.5, 3.0, 1.0, 1.0, 1.0],
        "m2kv32": [1.0, 1.0, 1.0, 1.0, 1.0],
    }
    times = iter(t for name in ours_ms for t in ours_ms[name])

    def measure(routine: str, flags: list[str], backends=("fa2",), **_: Any):  # noqa: ANN001, ANN202
        fake_gpu_measure.append(flags)
        ours = next(times)
        return {
            "fa2": {"median_time": ours, "tflops": 1.0, "case": "shape"},
            "flash": {"median_time": 1.0, "tflops": 1.0, "case": "shape"},
        }

    monkeypatch.setattr(bench_prefill, "measure", measure)
    tilings = tmp_path / "tilings.md"
    argv = ["--probe", "--tilings", ",".join(ours_ms), "--output", str(tilings)]
    assert bench_prefill.main(argv) == 0
    line = f"- {bench_prefill.FASTEST_FACT}: m2kv32 at head_dim 128, x1.00"
    assert line in tilings.read_text().splitlines()

    times = iter([1.0, 1.0])
    winner = tmp_path / "winner.md"
    assert bench_prefill.main(["--tilings", f"fastest:{tilings}", "--output", str(winner)]) == 0
    rows = [r for r in winner.read_text().splitlines() if r.startswith("| m")]
    assert [r.split(" | ")[0] for r in rows] == ["| m2kv32"] * 2
    assert bench_prefill.FASTEST_FACT not in winner.read_text()  # one tiling: nothing to rank
    with pytest.raises(SystemExit, match="it measured head_dim 128, not 64"):
        bench_prefill.main(["--head_dim", "64", "--tilings", f"fastest:{tilings}"])
    with pytest.raises(SystemExit, match="no 'fastest tiling"):
        bench_prefill.main(["--tilings", f"fastest:{winner}"])
    capsys.readouterr()


# -- GPU ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(routines.ROUTINES))
def test_every_backend_runs_and_passes_refcheck_on_the_gpu(name: str) -> None:
    routine = routines.ROUTINES[name]
    args = cli.parse_args(
        [
            *small_argv(name, list(routine.backends)),
            "--refcheck",
            "--num_iters",
            "3",
            "--use_cuda_events",
        ]
    )
    device = torch.device("cuda", torch.cuda.current_device())
    rows = cli.run_routine(args, device)
    ran = {row["backend"] for row in rows}
    assert {b for b in routine.backends if b not in TORCH_SIDE} | {"torch"} <= ran
    assert all(row["median_time"] > 0 for row in rows)


@pytest.mark.gpu
def test_the_documented_command_on_the_gpu(tmp_path: Path) -> None:
    output = tmp_path / "results.csv"
    argv = [
        "--routine",
        "BatchDecodeWithPagedKVCacheWrapper",
        "--backends",
        "fa2",
        "cudnn",
        "torch",
        "flash",
        "--batch_size",
        "4",
        "--s_kv",
        "1000",
        "--num_qo_heads",
        "32",
        "--num_kv_heads",
        "8",
        "--head_dim_qk",
        "128",
        "--head_dim_vo",
        "128",
        "--page_size",
        "16",
        "--refcheck",
        "-vv",
        "--output_path",
        str(output),
    ]
    assert cli.main(argv) == 0
    table = list(csv.DictReader(output.open()))
    assert {"fa2", "torch"} <= {row["backend"] for row in table}
    assert all(row["s_kv"] == "1000" and float(row["tb_per_sec"]) > 0 for row in table)


@pytest.mark.gpu
def test_a_testlist_of_every_family_on_the_gpu(tmp_path: Path) -> None:
    names = [sorted(names)[0] for names in FAMILIES.values()]
    lines = [
        " ".join(small_argv(name, ["fa2", "torch"], "--refcheck", "--use_cuda_events"))
        for name in names
    ]
    testlist = tmp_path / "cases.txt"
    testlist.write_text("\n".join(lines) + "\n")
    output = tmp_path / "results.csv"
    assert cli.main(["--testlist", str(testlist), "--output_path", str(output)]) == 0
    table = list(csv.DictReader(output.open()))
    assert sorted({row["routine"] for row in table}) == sorted(names)
    assert len(table) == 2 * len(names)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "script,rows",
    [
        (("bench_sampling.py", "--quick"), ["top_k_top_p_sampling_from_logits", "128 x 128k"]),
        (("bench_decode.py", "--quick"), ["| 64 | 4096 |", "| 1 | 32768 |"]),
        (("bench_family.py", "norm", "--quick"), ["| rmsnorm |", "| layernorm |"]),
        (("bench_family.py", "page", "--quick"), ["| append_paged_kv_cache |"]),
    ],
)
def test_gpu_bench_quick_run_writes_its_table(
    script: tuple[str, ...], rows: list[str], tmp_path: Path
) -> None:
    output = tmp_path / "results.md"
    proc = _run_bench(*script, "--output", str(output))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = output.read_text()
    assert all(row in text for row in rows), text
