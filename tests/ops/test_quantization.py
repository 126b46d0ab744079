"""packbits / segment_packbits against a plain-Python bit-packing model (CPU), argument
checks, and the same results from CUDA tensors (GPU)."""

from __future__ import annotations

import pytest
import torch

from flashinfer import quantization

LENGTHS = [0, 1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 1001, 4099]
ORDERS = ["big", "little"]


def model_packbits(bits: list[int], bitorder: str) -> list[int]:
    """numpy.packbits on a flat list, one bit at a time."""
    packed = []
    for start in range(0, len(bits), 8):
        byte = 0
        for j, bit in enumerate(bits[start : start + 8]):
            if bit:
                byte |= 1 << (7 - j if bitorder == "big" else j)
        packed.append(byte)
    return packed


def _random_bits(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=generator) < 0.5


def _segments(lengths: list[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor(
        [0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=dtype
    )


def model_segment_packbits(
    bits: list[int], lengths: list[int], bitorder: str
) -> tuple[list[int], list[int]]:
    packed, new_indptr, start = [], [0], 0
    for length in lengths:
        packed += model_packbits(bits[start : start + length], bitorder)
        new_indptr.append(len(packed))
        start += length
    return packed, new_indptr


# -- packbits ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bitorder", ORDERS)
@pytest.mark.parametrize("n", LENGTHS)
def test_packbits_matches_the_model(n: int, bitorder: str) -> None:
    x = _random_bits(n, seed=n)
    y = quantization.packbits(x, bitorder)
    assert y.dtype == torch.uint8 and y.shape == ((n + 7) // 8,)
    assert y.tolist() == model_packbits(x.int().tolist(), bitorder)


def test_known_bytes_and_the_default_order() -> None:
    one = torch.tensor([True])
    assert quantization.packbits(one).tolist() == [0b10000000]  # big by default, like numpy
    assert quantization.packbits(one, "little").tolist() == [0b00000001]
    x = torch.tensor([1, 1, 0, 0, 0, 0, 0, 0, 0, 1], dtype=torch.bool)
    assert quantization.packbits(x, "big").tolist() == [0b11000000, 0b01000000]
    assert quantization.packbits(x, "little").tolist() == [0b00000011, 0b00000010]
    assert quantization.packbits(torch.ones(16, dtype=torch.bool)).tolist() == [255, 255]


@pytest.mark.parametrize(
    "dtype",
    [
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
    ],
)
def test_nonzero_elements_of_any_real_dtype_are_ones(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    values = torch.randint(-2, 3, (77,), generator=generator)
    if dtype == torch.uint8:
        values = values.abs()
    x = values.to(dtype)
    for bitorder in ORDERS:
        assert quantization.packbits(x, bitorder).tolist() == model_packbits(
            (values != 0).int().tolist(), bitorder
        )


def test_any_shape_is_read_flattened_in_row_major_order() -> None:
    x = _random_bits(6 * 11, seed=3).view(6, 11)
    flat = x.reshape(-1).int().tolist()
    assert quantization.packbits(x).tolist() == model_packbits(flat, "big")
    transposed = x.t()  # not contiguous
    assert quantization.packbits(transposed, "little").tolist() == model_packbits(
        transposed.reshape(-1).int().tolist(), "little"
    )
    assert quantization.packbits(torch.tensor(True)).tolist() == [128]


def test_the_input_is_left_unchanged() -> None:
    x = _random_bits(13, seed=4)
    before = x.clone()
    quantization.packbits(x)
    quantization.segment_packbits(x, _segments([6, 7]))
    assert torch.equal(x, before)


# -- segment_packbits -------------------------------------------------------------------------


def _random_lengths(count: int, high: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (count,), generator=generator).tolist()


SEGMENTS = {
    "no segments": [],
    "one empty": [0],
    "empty only": [0, 0, 0],
    "one short": [5],
    "one of 8": [8],
    "mixed with empty": [0, 9, 0, 8, 1, 0, 17, 7],
    "one long": [1000],
    "many random": _random_lengths(60, 40, seed=5),
    "random long": _random_lengths(7, 3000, seed=6),
}


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("bitorder", ORDERS)
@pytest.mark.parametrize("case", list(SEGMENTS))
def test_segment_packbits_matches_the_model(
    case: str, bitorder: str, index_dtype: torch.dtype
) -> None:
    lengths = SEGMENTS[case]
    x = _random_bits(sum(lengths), seed=len(lengths))
    y, new_indptr = quantization.segment_packbits(x, _segments(lengths, index_dtype), bitorder)
    expected, expected_indptr = model_segment_packbits(x.int().tolist(), lengths, bitorder)
    assert y.dtype == torch.uint8 and y.tolist() == expected
    assert new_indptr.dtype == torch.int32 and new_indptr.tolist() == expected_indptr


def test_one_segment_is_packbits() -> None:
    x = _random_bits(1001, seed=7)
    for bitorder in ORDERS:
        y, new_indptr = quantization.segment_packbits(x, _segments([1001]), bitorder=bitorder)
        assert torch.equal(y, quantization.packbits(x, bitorder=bitorder))
        assert new_indptr.tolist() == [0, 126]


def test_segment_default_order_and_nonbool_input() -> None:
    x = torch.tensor([3, 0, -1, 0, 0, 0, 0, 0, 0, 2], dtype=torch.int32)
    y, new_indptr = quantization.segment_packbits(x, _segments([3, 0, 7]))
    assert y.tolist() == [0b10100000, 0b00000010]
    assert new_indptr.tolist() == [0, 1, 1, 2]


# -- bad arguments ----------------------------------------------------------------------------

PACK_BAD = [
    ("x must be a torch.Tensor, got list", TypeError, lambda: quantization.packbits([1, 0])),
    (
        "x has dtype torch.complex64",
        TypeError,
        lambda: quantization.packbits(torch.zeros(4, dtype=torch.complex64)),
    ),
    (
        "bitorder must be 'big' or 'little', got 'middle'",
        ValueError,
        lambda: quantization.packbits(torch.ones(4, dtype=torch.bool), "middle"),
    ),
    (
        "bitorder must be 'big' or 'little', got 'Big'",
        ValueError,
        lambda: quantization.packbits(torch.ones(4, dtype=torch.bool), "Big"),
    ),
    (
        "bitorder must be a str, got int",
        TypeError,
        lambda: quantization.packbits(torch.ones(4, dtype=torch.bool), 1),
    ),
]


def _seg(x: object, indptr: object, bitorder: object = "big"):  # noqa: ANN202
    return lambda: quantization.segment_packbits(x, indptr, bitorder)


BITS = torch.ones(10, dtype=torch.bool)
SEGMENT_BAD = [
    ("x must be a torch.Tensor, got tuple", TypeError, _seg((1, 0), _segments([2]))),
    ("indptr must be a torch.Tensor, got list", TypeError, _seg(BITS, [0, 10])),
    ("indptr has dtype torch.float32", TypeError, _seg(BITS, torch.tensor([0.0, 10.0]))),
    (
        "indptr has dtype torch.int16",
        TypeError,
        _seg(BITS, torch.tensor([0, 10], dtype=torch.int16)),
    ),
    ("indptr must be 1-D", ValueError, _seg(BITS, torch.tensor([[0, 10]], dtype=torch.int32))),
    (
        "indptr needs batch_size \\+ 1 elements, got 0",
        ValueError,
        _seg(BITS, torch.tensor([], dtype=torch.int32)),
    ),
    (
        r"indptr must start at 0, got indptr\[0\] = 2",
        ValueError,
        _seg(BITS, torch.tensor([2, 10], dtype=torch.int32)),
    ),
    (
        r"indptr must be non-decreasing, but indptr\[2\] = 3 < indptr\[1\] = 6",
        ValueError,
        _seg(BITS, torch.tensor([0, 6, 3, 10], dtype=torch.int32)),
    ),
    (
        r"indptr\[-1\] must equal the number of elements of x \(10\), got 9",
        ValueError,
        _seg(BITS, torch.tensor([0, 4, 9], dtype=torch.int32)),
    ),
    (
        r"indptr\[-1\] must equal the number of elements of x \(10\), got 11",
        ValueError,
        _seg(BITS, torch.tensor([0, 11], dtype=torch.int64)),
    ),
    (
        r"indptr\[-1\] must equal the number of elements of x \(10\), got 0",
        ValueError,
        _seg(BITS, torch.tensor([0], dtype=torch.int32)),
    ),
    (
        "bitorder must be 'big' or 'little', got 'LSB'",
        ValueError,
        _seg(BITS, _segments([10]), "LSB"),
    ),
    ("bitorder must be a str, got NoneType", TypeError, _seg(BITS, _segments([10]), None)),
]


@pytest.mark.parametrize(
    "message,error,call", PACK_BAD + SEGMENT_BAD, ids=[b[0][:40] for b in PACK_BAD + SEGMENT_BAD]
)
def test_bad_arguments(message: str, error: type[Exception], call) -> None:  # noqa: ANN001
    with pytest.raises(error, match=message):
        call()


# -- CUDA tensors -----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("bitorder", ORDERS)
def test_cuda_tensors_give_the_cpu_results(bitorder: str) -> None:
    for n in LENGTHS + [1 << 20]:
        x = _random_bits(n, seed=n)
        y = quantization.packbits(x.cuda(), bitorder)
        assert y.device.type == "cuda"
        assert torch.equal(y.cpu(), quantization.packbits(x, bitorder))
    lengths = SEGMENTS["many random"] + SEGMENTS["random long"]
    x = _random_bits(sum(lengths), seed=8)
    indptr = _segments(lengths)
    expected, expected_indptr = quantization.segment_packbits(x, indptr, bitorder)
    for indptr_device in ("cuda", "cpu"):  # the reference's form, and a host indptr
        y, new_indptr = quantization.segment_packbits(x.cuda(), indptr.to(indptr_device), bitorder)
        assert y.device.type == "cuda" and new_indptr.device.type == indptr_device
        assert torch.equal(y.cpu(), expected) and torch.equal(new_indptr.cpu(), expected_indptr)
