"""fi_trace: a template for every public API, definitions from CPU and fake tensors, the
committed fi_trace_out/ up to date, and the FLASHINFER_TRACE_DUMP auto-dump.

Shapes of the reference's TraceTemplate / definition JSON read from flashinfer-ai/flashinfer
flashinfer/trace/template.py @ 00c6ba87b4426f9882c8b9f67f33c06dc724cf15 and
tests/trace/fi_trace_out/gqa_paged_decode_h32_kv8_d128_ps16.json @ 0bd378dc4bd2.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import flashinfer
from flashinfer import api_logging
from flashinfer.api_logging import API_MARKER, flashinfer_api
from flashinfer.config import config
from flashinfer.fi_trace import fi_trace
from flashinfer.trace import ApiTrace, Const, Tensor, TraceTemplate, Var
from tests.conftest import run_python
from tests.trace import example

FAMILIES = (
    "activation",
    "cascade",
    "decode",
    "norm",
    "page",
    "prefill",
    "quantization",
    "rope",
    "sampling",
)
# Host-side set-up methods: they launch no kernel, so there is no definition to trace.
UNTRACED = {"plan", "begin_forward", "prewarm_paged_kv_stride_variant"}
KEYS = ["name", "description", "op_type", "tags", "axes", "inputs", "outputs", "reference"]


def public_apis() -> dict[str, Callable[..., Any]]:
    found = {}
    for family in FAMILIES:
        module = importlib.import_module(f"flashinfer.{family}")
        for name, value in vars(module).items():
            if name.startswith("_"):
                continue
            if inspect.isclass(value) and value.__module__ == module.__name__:
                for attr, member in vars(value).items():
                    if getattr(member, API_MARKER, False) and attr not in UNTRACED:
                        found[f"{family}.{name}.{attr}"] = member
            elif getattr(value, API_MARKER, False):
                found[f"{family}.{name}"] = value
    return found


APIS = public_apis()


def test_every_public_api_is_found() -> None:
    assert len(APIS) >= 45 and "norm.rmsnorm" in APIS
    assert "decode.BatchDecodeWithPagedKVCacheWrapper.run" in APIS


@pytest.mark.parametrize("name", sorted(APIS))
def test_every_public_api_has_a_template_matching_its_parameters(name: str) -> None:
    api = APIS[name]
    trace = getattr(api, "fi_trace", None)
    assert isinstance(trace, ApiTrace), f"{name} lacks @flashinfer_api(trace=...)"
    template = trace.template
    params = set(inspect.signature(api).parameters) | set(template.plan_attrs)
    for key, desc in template.inputs.items():
        assert (desc.param or key) in params, f"{name}: input {key} is no parameter"
    for key, desc in template.outputs.items():
        assert getattr(desc, "param", None) in (None, *params), f"{name}: output {key}"
    assert template.reference is not None, f"{name}: no reference"
    assert template.reference.__module__ == "flashinfer.testing.reference"


def test_every_public_api_has_an_example() -> None:
    covered = {f"{api.__module__}.{api.__qualname__}" for api, _ in example.examples()}
    traced = {f"{api.__module__}.{api.__qualname__}" for api in APIS.values()}
    assert traced <= covered, sorted(traced - covered)


def check_definition(d: dict[str, Any], api: Callable[..., Any]) -> None:
    """flashinfer-bench's definition schema, and every const axis resolved."""
    assert list(d)[:5] == KEYS[:5] and set(KEYS) <= set(d)
    assert d["tags"][0] == f"fi_api:{api.__module__}.{api.__qualname__}"
    assert isinstance(d["name"], str) and d["name"] and isinstance(d["description"], str)
    for axis, entry in d["axes"].items():
        assert entry["type"] in ("var", "const")
        if entry["type"] == "const":
            assert isinstance(entry.get("value"), int), (d["name"], axis)
    for section in ("inputs", "outputs"):
        for key, entry in d[section].items():
            assert set(entry) <= {"shape", "dtype", "optional", "description"}
            if entry["shape"] is not None:
                assert set(entry["shape"]) <= set(d["axes"]), (d["name"], key)
            if not entry.get("optional"):
                assert entry["dtype"] != "unknown", (d["name"], section, key)
    json.dumps(d)


@pytest.mark.parametrize("fake", [False, True], ids=["cpu", "fake"])
def test_definitions_from_cpu_and_fake_tensors(fake: bool) -> None:
    mode = FakeTensorMode() if fake else torch.inference_mode()
    with mode:
        calls = example.examples()
        for api, kwargs in calls:
            check_definition(api.fi_trace(**kwargs), api)


def test_committed_examples_are_up_to_date(tmp_path: Path) -> None:
    written = example.main(tmp_path)
    committed = sorted(p.name for p in example.OUT_DIR.glob("*.json"))
    assert sorted(p.name for p in written) == committed, "re-run tests/trace/example.py"
    for path in written:
        assert path.read_text() == (example.OUT_DIR / path.name).read_text(), path.name


def test_reference_sources_run_standalone() -> None:
    for api in APIS.values():
        template = api.fi_trace.template
        namespace: dict[str, Any] = {}
        exec(api.fi_trace(**{})["reference"], namespace)  # noqa: S102 - our own source
        assert callable(namespace[template.reference.__name__])


def test_reference_matches_the_schema_names() -> None:
    d = flashinfer.rmsnorm.fi_trace(
        input=torch.empty(3, 4096, dtype=torch.float16),
        weight=torch.empty(4096, dtype=torch.float16),
    )
    assert d["name"] == "rmsnorm_h4096" and d["op_type"] == "rmsnorm"
    assert d["axes"] == {
        "batch_size": {"type": "var", "description": "Rows (tokens)."},
        "hidden_size": {"type": "const", "value": 4096},
    }
    assert d["inputs"]["input"] == {"shape": ["batch_size", "hidden_size"], "dtype": "float16"}
    assert d["outputs"]["output"]["dtype"] == "float16"
    assert "def rmsnorm(" in d["reference"]


def test_bound_method_reads_the_plan(tmp_path: Path) -> None:
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(1 << 20, dtype=torch.uint8), kv_layout="HND"
    )
    wrapper._paged_kv_indptr_buf = torch.zeros(3, dtype=torch.int32)  # what plan() stores
    wrapper._paged_kv_indices_buf = torch.zeros(5, dtype=torch.int32)
    q, cache = (
        torch.empty(2, 32, 128, dtype=torch.bfloat16),
        torch.empty(9, 8, 16, 128, dtype=torch.bfloat16),
    )
    unbound = type(wrapper).run.fi_trace(q=q, paged_kv_cache=(cache, cache))
    bound = fi_trace(wrapper.run, save_dir=tmp_path, q=q, paged_kv_cache=(cache, cache))
    assert unbound["inputs"]["kv_indptr"]["dtype"] == "unknown"
    assert bound["inputs"]["kv_indptr"]["dtype"] == "int32"
    assert bound["inputs"]["k_cache"]["shape"] == [
        "num_pages",
        "num_kv_heads",
        "page_size",
        "head_dim",
    ]  # HND from the wrapper
    assert bound["name"] == "gqa_paged_decode_h32_kv8_d128_ps16"
    assert json.loads((tmp_path / f"{bound['name']}.json").read_text()) == bound


def test_single_paged_cache_tensor_is_split() -> None:
    cache = torch.empty(9, 2, 16, 8, 128, dtype=torch.float16)
    d = flashinfer.BatchDecodeWithPagedKVCacheWrapper.run.fi_trace(
        q=torch.empty(2, 32, 128, dtype=torch.float16), paged_kv_cache=cache
    )
    assert d["name"] == "gqa_paged_decode_h32_kv8_d128_ps16"
    assert d["inputs"]["v_cache"]["dtype"] == "float16"


def test_prefill_definitions_carry_v_and_the_outputs_head_dim() -> None:
    """head_dim_vo is v's (and the output's) head_dim: 128 under q and k of 192 (MLA
    prefill), head_dim otherwise; it is left out of the name."""
    bf16 = dict(dtype=torch.bfloat16)
    q, k = torch.empty(5, 16, 192, **bf16), torch.empty(40, 16, 192, **bf16)
    mla = flashinfer.single_prefill_with_kv_cache.fi_trace(
        q=q, k=k, v=torch.empty(40, 16, 128, **bf16)
    )
    assert mla["name"] == "gqa_single_prefill_h16_kv16_d192"
    assert (mla["axes"]["head_dim"]["value"], mla["axes"]["head_dim_vo"]["value"]) == (192, 128)
    assert mla["inputs"]["v"]["shape"] == ["kv_len", "num_kv_heads", "head_dim_vo"]
    assert mla["outputs"]["output"]["shape"] == ["qo_len", "num_qo_heads", "head_dim_vo"]
    pages = (torch.empty(3, 16, 2, 192, **bf16), torch.empty(3, 16, 2, 128, **bf16))
    paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper.run.fi_trace(
        q=torch.empty(5, 8, 192, **bf16), paged_kv_cache=pages
    )
    assert paged["axes"]["head_dim_vo"]["value"] == 128
    assert paged["inputs"]["v_cache"]["shape"][-1] == "head_dim_vo"
    same = flashinfer.BatchPrefillWithRaggedKVCacheWrapper.run.fi_trace(
        q=torch.empty(5, 8, 128, **bf16), k=torch.empty(9, 2, 128, **bf16), v=k[:9, :2, :128]
    )
    assert same["name"] == "gqa_ragged_h8_kv2_d128"
    assert same["axes"]["head_dim_vo"]["value"] == same["axes"]["head_dim"]["value"] == 128


def test_fi_trace_refuses_untraced_functions() -> None:
    with pytest.raises(ValueError, match="func_or_method"):
        fi_trace(len)
    with pytest.raises(TypeError, match="TraceTemplate"):
        flashinfer_api(trace={"op_type": "x"})(lambda: None)


def test_template_rejects_undeclared_axes() -> None:
    with pytest.raises(ValueError, match="undeclared"):
        TraceTemplate("x", {"n": Var()}, {"a": Tensor(("n", "m"))}, {})


def test_both_decorator_forms_return_the_function_when_off(monkeypatch) -> None:
    monkeypatch.setattr(api_logging, "_TRACE_DUMP", False)
    logger = api_logging.ApiLogger(0, None)  # type: ignore[arg-type]
    monkeypatch.setattr(api_logging, "_API_LOGGER", logger)

    def plain(x):  # noqa: ANN001, ANN202
        return x

    def traced(x):  # noqa: ANN001, ANN202
        return x

    template = TraceTemplate("t", {"n": Const()}, {"x": Tensor(("n",))}, {})
    assert flashinfer_api(plain) is plain
    assert flashinfer_api(trace=template)(traced) is traced
    assert isinstance(traced.fi_trace, ApiTrace) and getattr(traced, API_MARKER)
    assert traced.fi_trace(x=torch.empty(7))["name"] == "t_n7"


def test_no_wrapper_without_trace_dump() -> None:
    """At level 0 with FLASHINFER_TRACE_DUMP unset the APIs are the undecorated functions."""
    code = (
        "import flashinfer, inspect; f = flashinfer.rmsnorm; "
        "assert not hasattr(f, '__wrapped__'), f; "
        "assert 'return _rmsnorm(' in inspect.getsource(f); print('plain')"
    )
    out = run_python(code, env={"FLASHINFER_LOGLEVEL": "0", "FLASHINFER_TRACE_DUMP": "0"})
    assert out.stdout.strip() == "plain"


def test_auto_dump_writes_once_per_const_axes(tmp_path: Path) -> None:
    code = """
import torch, flashinfer
def call(tokens, hidden):
    try:  # CPU tensors: the call itself refuses (CUDA needed) after the dump
        flashinfer.rmsnorm(torch.empty(tokens, hidden), torch.empty(hidden))
    except ValueError as err:
        assert "CUDA" in str(err), err
call(4, 4096); call(9, 4096); call(4, 1024)
assert hasattr(flashinfer.rmsnorm, "__wrapped__") and flashinfer.rmsnorm.fi_trace
"""
    out_dir = tmp_path / "traces"
    run_python(
        code,
        env={
            "FLASHINFER_LOGLEVEL": "0",
            "FLASHINFER_TRACE_DUMP": "1",
            "FLASHINFER_TRACE_DUMP_DIR": str(out_dir),
        },
    )
    assert sorted(p.name for p in out_dir.iterdir()) == ["rmsnorm_h1024.json", "rmsnorm_h4096.json"]
    d = json.loads((out_dir / "rmsnorm_h4096.json").read_text())
    assert d["tags"][0] == "fi_api:flashinfer.norm.rmsnorm" and d["inputs"]["input"]["dtype"] == (
        "float32"
    )


def test_auto_dump_dedups_per_process(tmp_path: Path, monkeypatch) -> None:
    from flashinfer.trace import api

    monkeypatch.setenv("FLASHINFER_TRACE_DUMP_DIR", str(tmp_path))
    api.reset_dumped()
    trace = flashinfer.silu_and_mul.fi_trace
    x = torch.empty(3, 64)
    first = trace.dump_once((x,), {})
    assert first == tmp_path / "silu_and_mul_h32.json" and first.exists()
    first.unlink()
    assert trace.dump_once((), {"input": torch.empty(5, 64)}) is None  # same const axes
    assert trace.dump_once((torch.empty(5, 128),), {}) == tmp_path / "silu_and_mul_h64.json"
    api.reset_dumped()


def test_env_var_defaults(monkeypatch) -> None:
    monkeypatch.delenv("FLASHINFER_TRACE_DUMP", raising=False)
    monkeypatch.delenv("FLASHINFER_TRACE_DUMP_DIR", raising=False)
    assert config.trace_dump is False and config.trace_dump_dir == Path(".")
    monkeypatch.setenv("FLASHINFER_TRACE_DUMP", "maybe")
    with pytest.raises(ValueError, match="FLASHINFER_TRACE_DUMP"):
        _ = config.trace_dump


def test_norms_count_every_leading_dim_as_rows() -> None:
    """rmsnorm takes ``[..., hidden]``: a per-head call ``[batch, heads, head_dim]`` is
    ``batch * heads`` rows of ``head_dim``, not ``heads`` wide."""
    weight = torch.randn(128, dtype=torch.bfloat16)
    flat = flashinfer.rmsnorm.fi_trace(
        input=torch.randn(32, 128, dtype=torch.bfloat16), weight=weight
    )
    per_head = flashinfer.rmsnorm.fi_trace(
        input=torch.randn(4, 8, 128, dtype=torch.bfloat16), weight=weight
    )
    assert per_head["name"] == flat["name"] == "rmsnorm_h128"
    assert per_head["axes"]["hidden_size"]["value"] == 128
