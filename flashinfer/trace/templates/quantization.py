"""Templates of the bit-packing family (flashinfer/quantization.py)."""

from __future__ import annotations

from ...testing import reference as ref
from ..template import Scalar, Tensor, TraceTemplate, Var

packbits_trace = TraceTemplate(
    op_type="packbits",
    name_prefix="packbits",
    description="numpy.packbits: 8 bools a byte, bitorder 'big' or 'little'.",
    axes={"num_elements": Var(), "num_bytes": Var()},
    constraints=("num_bytes == (num_elements + 7) // 8",),
    inputs={"x": Tensor(("num_elements",)), "bitorder": Scalar("str")},
    outputs={"y": Tensor(("num_bytes",), dtype="uint8")},
    tags=("status:verified",),
    reference=ref.packbits,
)

segment_packbits_trace = TraceTemplate(
    op_type="packbits",
    name_prefix="segment_packbits",
    description="packbits of each segment x[indptr[i]:indptr[i+1]], with the packed indptr.",
    axes={"num_elements": Var(), "num_bytes": Var(), "len_indptr": Var()},
    inputs={
        "x": Tensor(("num_elements",)),
        "indptr": Tensor(("len_indptr",)),
        "bitorder": Scalar("str"),
    },
    outputs={
        "y": Tensor(("num_bytes",), dtype="uint8"),
        "new_indptr": Tensor(("len_indptr",), dtype_from="indptr"),
    },
    tags=("status:verified",),
    reference=ref.packbits,
)
