"""The element types kernels are specialized for, and their names in each world."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .render import PendingRender


@dataclass(frozen=True)
class DTypeInfo:
    short: str  # used in module URIs: norm_dtype_bf16
    name: str  # torch's name: bfloat16
    cuda_type: str  # the C++ type in kernel TUs
    dlpack_code: int  # kDLFloat = 2, kDLBfloat = 4, kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12
    bits: int


_TABLE = (
    DTypeInfo("f16", "float16", "__half", 2, 16),
    DTypeInfo("bf16", "bfloat16", "__nv_bfloat16", 4, 16),
    DTypeInfo("f32", "float32", "float", 2, 32),
)
# storage-only types: an fp8 KV cache (kernels widen it to float where they read it)
_FP8_TABLE = (
    DTypeInfo("e4m3", "float8_e4m3fn", "__nv_fp8_e4m3", 10, 8),
    DTypeInfo("e5m2", "float8_e5m2", "__nv_fp8_e5m2", 12, 8),
)


def _by_name(table: tuple[DTypeInfo, ...]) -> dict[str, DTypeInfo]:
    return {key: info for info in table for key in (info.short, info.name)}


_BY_NAME = _by_name(_TABLE)
_BY_NAME.update(half=_BY_NAME["float16"], float=_BY_NAME["float32"])
_FP8_BY_NAME = _by_name(_FP8_TABLE)
_STORAGE_TABLE = _TABLE + _FP8_TABLE
_STORAGE_BY_NAME = {**_BY_NAME, **_FP8_BY_NAME}
FP8_NAMES = tuple(info.name for info in _FP8_TABLE)  # torch's names: float8_e4m3fn, ...


def _lookup(dtype: Any, by_name: dict[str, DTypeInfo], table: tuple[DTypeInfo, ...]) -> DTypeInfo:
    key = str(dtype).removeprefix("torch.")
    try:
        return by_name[key]
    except KeyError:
        supported = ", ".join(info.name for info in table)
        raise TypeError(f"unsupported dtype {dtype!r}; supported: {supported}") from None


def dtype_info(dtype: Any) -> DTypeInfo:
    """Accepts a torch.dtype or a name ("bfloat16", "bf16", "torch.bfloat16")."""
    return _lookup(dtype, _BY_NAME, _TABLE)


def storage_info(dtype: Any) -> DTypeInfo:
    """A type kernels store or copy: :func:`dtype_info`'s, or an fp8 one."""
    return _lookup(dtype, _STORAGE_BY_NAME, _STORAGE_TABLE)


def dtype_config(uri: str, output_name: str, info: DTypeInfo) -> PendingRender:
    """The render of csrc/dtype_config.jinja (DType for the kernel TU, DLPack code and width
    for the binding) into the module's generated dir."""
    return PendingRender.of(
        "dtype_config.jinja",
        uri,
        output_name,
        uri=uri,
        dtype_name=info.name,
        cuda_type=info.cuda_type,
        dlpack_code=info.dlpack_code,
        bits=info.bits,
    )


def dtype_uri(op: str, dtype: Any) -> str:
    """The URI of an op's module specialized by dtype alone: ``norm_dtype_bf16``."""
    return f"{op}_dtype_{storage_info(dtype).short}"


def gen_dtype_module(
    op: str,
    dtype: Any,
    sources: list[str],
    function_args: dict[str, tuple[str, ...]],
    fp8: bool = False,
):  # noqa: ANN201 - JitSpec
    """The spec of ``op``'s module for ``dtype`` (:func:`dtype_info`'s types, and with ``fp8``
    the fp8 ones too): ``<op>_config.h`` rendered from csrc/dtype_config.jinja, and
    ``sources`` (from csrc/) compiled with it."""
    from .core import gen_jit_spec

    info = storage_info(dtype) if fp8 else dtype_info(dtype)
    uri = dtype_uri(op, info.name)
    config = dtype_config(uri, f"{op}_config.h", info)
    return gen_jit_spec(uri, sources, generated_sources=[config], function_args=function_args)
