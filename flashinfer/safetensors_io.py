"""Reads and writes the safetensors format for dumps, without the safetensors package.

The format is small and fixed: an 8-byte little-endian header length, a JSON header
mapping each name to dtype, shape and byte offsets (plus optional string metadata),
then the raw little-endian data. Loading it never unpickles anything.
"""

from __future__ import annotations

import ctypes
import json
import struct
from pathlib import Path

import torch

_CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
                     ("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64")):
    if hasattr(torch, _name):
        _CODES[getattr(torch, _name)] = _code
_DTYPES = {code: dtype for dtype, code in _CODES.items()}


def save_file(tensors: dict[str, torch.Tensor], path: Path,
              metadata: dict[str, str] | None = None) -> int:
    """Write ``tensors`` to ``path``; returns the bytes written."""
    header: dict[str, object] = {}
    blobs: list[bytes] = []
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _CODES:
            raise TypeError(f"safetensors cannot store dtype {tensor.dtype} ({name})")
        data = tensor.detach().cpu().contiguous()
        nbytes = data.numel() * data.element_size()
        blobs.append(ctypes.string_at(data.data_ptr(), nbytes) if nbytes else b"")
        header[name] = {
            "dtype": _CODES[data.dtype],
            "shape": list(data.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(encoded)))
        fh.write(encoded)
        for blob in blobs:
            fh.write(blob)
    return 8 + len(encoded) + offset


def load_file(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a safetensors file into CPU tensors and its metadata."""
    raw = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    metadata = header.pop("__metadata__", {})
    body = memoryview(raw)[8 + length :]
    tensors: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        if end == begin:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        chunk = bytearray(body[begin:end])
        tensors[name] = torch.frombuffer(chunk, dtype=torch.uint8).view(dtype).reshape(
            info["shape"]
        )
    return tensors, metadata
