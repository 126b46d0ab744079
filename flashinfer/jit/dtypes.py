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
    dlpack_code: int  # kDLFloat = 2, kDLBfloat = 4
    bits: int


_TABLE = (
    DTypeInfo("f16", "float16", "__half", 2, 16),
    DTypeInfo("bf16", "bfloat16", "__nv_bfloat16", 4, 16),
    DTypeInfo("f32", "float32", "float", 2, 32),
)
_BY_NAME = {key: info for info in _TABLE for key in (info.short, info.name)}
_BY_NAME.update(half=_BY_NAME["float16"], float=_BY_NAME["float32"])


def dtype_info(dtype: Any) -> DTypeInfo:
    """Accepts a torch.dtype or a name ("bfloat16", "bf16", "torch.bfloat16")."""
    key = str(dtype).removeprefix("torch.")
    try:
        return _BY_NAME[key]
    except KeyError:
        supported = ", ".join(info.name for info in _TABLE)
        raise TypeError(f"unsupported dtype {dtype!r}; supported: {supported}") from None


def dtype_config(uri: str, output_name: str, dtype: Any) -> PendingRender:
    """The render of csrc/dtype_config.jinja (DType for the kernel TU, DLPack code and width
    for the binding) into the module's generated dir."""
    info = dtype_info(dtype)
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
    return f"{op}_dtype_{dtype_info(dtype).short}"


def gen_dtype_module(
    op: str, dtype: Any, sources: list[str], function_args: dict[str, tuple[str, ...]]
):  # noqa: ANN201 - JitSpec
    """The spec of ``op``'s module for ``dtype``: ``<op>_config.h`` rendered from
    csrc/dtype_config.jinja, and ``sources`` (from csrc/) compiled with it."""
    from .core import gen_jit_spec

    uri = dtype_uri(op, dtype)
    config = dtype_config(uri, f"{op}_config.h", dtype)
    return gen_jit_spec(uri, sources, generated_sources=[config], function_args=function_args)
