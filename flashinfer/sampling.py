"""Sorting-free sampling: logits or probabilities in, token ids out.

Filters keep an upper set of each row: top-k (the k most likely tokens, ties with the k-th
kept), top-p (token j is kept iff the tokens strictly more likely than j hold less than
``top_p`` of the mass), min-p (``p >= min_p * max(p)``). Kernels find the set's pivot by
radix select and draw with an exponential race, without sorting the vocabulary; see
include/flashinfer/sampling.cuh.

Every per-request parameter (``top_k``, ``top_p``, ``min_p``, ``temperature``) is a Python
scalar, checked here, or a ``[batch]`` tensor on the input's device, whose values stay on
the device (no sync): there ``top_k < 1`` acts as 1, ``top_k >= vocab`` and ``top_p >= 1``
keep everything, ``min_p <= 0`` keeps everything.

Randomness: ``seed``/``offset``, or a ``generator``, or the device's default CUDA
generator (see :mod:`flashinfer.rng`). The same seed and offset give the same tokens in
any process. Every kernel is deterministic, so ``deterministic`` is accepted for API
compatibility and both values run the same deterministic algorithm.

``indices`` (``[batch]``, int32 or int64) maps output row i to input row ``indices[i]``,
so one distribution can be sampled several times; an index outside the input's rows
yields token -1 (device values are not read on the host). A row without any positive
probability yields token 0. Tokens are int32.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from . import checks
from .api_logging import flashinfer_api
from .jit.sampling import gen_sampling_module
from .pdl import resolve_enable_pdl
from .rng import as_int64, check_seed_args, philox_seed_offset

_LOGIT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_PROB_DTYPES = (torch.float32,)
_FILTER_ORDERS = ("top_k_first", "joint")
# Filter bits understood by csrc/sampling.cc.
_TOP_K, _TOP_P, _MIN_P = 1, 2, 4


@functools.cache
def get_sampling_module(dtype: Any):  # noqa: ANN201 - a tvm_ffi.Module
    """The sampling module for logits of ``dtype`` (float32 serves probabilities too)."""
    return gen_sampling_module(dtype).build_and_load()


def _check_rows(name: str, tensor: Any, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    checks.check_tensor(name, tensor)
    checks.check_ndim(name, tensor, 2, "[batch, vocab_size]")
    checks.check_dtype(name, tensor, dtypes)
    checks.check_last_dim_contiguous(name, tensor)
    if tensor.shape[1] < 1:
        raise ValueError(f"{name} has vocab_size 0")
    if tensor.shape[1] >= 1 << 31 or tensor.shape[0] >= 1 << 31:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}; each dim must be < 2^31")
    return tensor



def _check_indices(indices: Any, like: torch.Tensor) -> tuple[torch.Tensor | None, int]:
    """The int32 indices (or None) and the output batch size."""
    if indices is None:
        return None, like.shape[0]
    checks.check_index_tensor("indices", indices, None, (torch.int32, torch.int64))
    checks.check_same_device("indices", indices, like)
    if indices.shape[0] >= 1 << 31:
        raise ValueError("indices has too many elements")
    return indices.to(torch.int32), indices.shape[0]


def _per_request(name: str, value: Any, batch: int, like: torch.Tensor, integer: bool,
                 low: float, high: float, low_open: bool) -> tuple[torch.Tensor | None, float]:
    """A scalar checked against [low, high] (or (low, high]) or a [batch] tensor.
    Returns (tensor or None, scalar)."""
    if isinstance(value, torch.Tensor):
        checks.check_ndim(name, value, 1, "[batch] per-request tensor")
        if value.shape[0] != batch:
            raise ValueError(f"{name} has {value.shape[0]} elements, the batch has {batch}")
        if value.dtype == torch.bool or (value.dtype.is_floating_point and integer):
            raise TypeError(f"{name} has dtype {value.dtype}; expected an integer tensor")
        if value.is_complex():
            raise TypeError(f"{name} has dtype {value.dtype}; expected a real tensor")
        checks.check_same_device(name, value, like)
        return value.to(torch.int32 if integer else torch.float32).contiguous(), low
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        expected = "an int" if integer else "a float"
        raise TypeError(f"{name} must be {expected} or a [batch] tensor, "
                        f"got {type(value).__name__}")
    bad_low = value <= low if low_open else value < low
    if not math.isfinite(value) or bad_low or value > high:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high == math.inf else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value}")
    return None, value


def _check_flags(deterministic: Any, check_nan: Any) -> None:
    for name, flag in (("deterministic", deterministic), ("check_nan", check_nan)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")


def _check_no_nan(name: str, tensor: torch.Tensor) -> None:
    """Host-synchronizing NaN check, only when the caller asked for it."""
    if bool(torch.isnan(tensor).any()):
        raise ValueError(f"{name} contains NaN")


def _sample_probs(probs: torch.Tensor, indices: Any, *, top_k: Any = None, top_p: Any = None,
                  min_p: Any = None, top_k_first: bool = True, deterministic: Any = True,
                  generator: torch.Generator | None = None, check_nan: Any = False,
                  seed: int | None = None, offset: int | None = None,
                  from_logits: bool = False) -> torch.Tensor:
    """The one filtered sampling path: validate everything once, then one sampling launch
    (``from_logits``: ``probs`` holds logits, turned into probabilities by :func:`softmax`
    first)."""
    name = "logits" if from_logits else "probs"
    _check_rows(name, probs, _LOGIT_DTYPES if from_logits else _PROB_DTYPES)
    _check_flags(deterministic, check_nan)
    index, batch = _check_indices(indices, probs)
    vocab = probs.shape[1]
    which, k_values, p_values, m_values = 0, None, None, None
    k, p, m = 1, 1.0, 0.0
    if top_k is not None:
        which |= _TOP_K
        k_values, k = _per_request("top_k", top_k, batch, probs, True, 1, vocab, False)
    if top_p is not None:
        which |= _TOP_P
        p_values, p = _per_request("top_p", top_p, batch, probs, False, 0.0, 1.0, True)
    if min_p is not None:
        which |= _MIN_P
        m_values, m = _per_request("min_p", min_p, batch, probs, False, 0.0, 1.0, False)
    check_seed_args(generator, seed, offset)
    checks.check_cuda(name, probs)
    if check_nan:
        _check_no_nan(name, probs)
    seed, offset = philox_seed_offset(probs.device, generator, seed, offset)
    if from_logits:
        probs = softmax(probs)
    out = torch.empty(batch, dtype=torch.int32, device=probs.device)
    if batch:
        get_sampling_module(torch.float32).sampling_from_probs(
            out, probs, index, k_values, p_values, m_values, int(k), float(p), float(m), which,
            top_k_first, as_int64(seed), as_int64(offset))
    return out


def _filter_order(filter_apply_order: Any) -> bool:
    if filter_apply_order not in _FILTER_ORDERS:
        raise ValueError(f"filter_apply_order must be one of {', '.join(_FILTER_ORDERS)}, "
                         f"got {filter_apply_order!r}")
    return filter_apply_order == "top_k_first"


@flashinfer_api
def softmax(logits: torch.Tensor, temperature: float | torch.Tensor | None = None,
            enable_pdl: bool | None = None) -> torch.Tensor:
    """``softmax(logits / temperature)`` over each row, as float32 ``[batch, vocab]``.
    ``enable_pdl`` (default: on sm90+) lets the kernel launch while the previous one drains
    (programmatic dependent launch)."""
    _check_rows("logits", logits, _LOGIT_DTYPES)
    values, scalar = (None, 1.0) if temperature is None else _per_request(
        "temperature", temperature, logits.shape[0], logits, False, 0.0, math.inf, True)
    enable_pdl = resolve_enable_pdl(enable_pdl, logits.device)
    checks.check_cuda("logits", logits)
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    if logits.shape[0]:
        get_sampling_module(logits.dtype).softmax(out, logits, values, float(scalar), enable_pdl)
    return out


@flashinfer_api
def sampling_from_probs(probs: torch.Tensor, indices: torch.Tensor | None = None,
                        deterministic: bool = True, generator: torch.Generator | None = None,
                        check_nan: bool = False, seed: int | None = None,
                        offset: int | None = None) -> torch.Tensor:
    """One token per row of ``probs`` (float32 ``[batch, vocab]``, non-negative; rows need
    not be normalized), drawn with probability ``p / sum(p)``."""
    return _sample_probs(probs, indices, deterministic=deterministic, generator=generator,
                         check_nan=check_nan, seed=seed, offset=offset)


@flashinfer_api
def sampling_from_logits(logits: torch.Tensor, indices: torch.Tensor | None = None,
                         deterministic: bool = True, generator: torch.Generator | None = None,
                         check_nan: bool = False, seed: int | None = None,
                         offset: int | None = None) -> torch.Tensor:
    """One token per row drawn from ``softmax(logits)`` in a single pass (Gumbel-max: no
    softmax is materialized). ``-inf`` logits are never drawn."""
    _check_rows("logits", logits, _LOGIT_DTYPES)
    _check_flags(deterministic, check_nan)
    index, batch = _check_indices(indices, logits)
    check_seed_args(generator, seed, offset)
    checks.check_cuda("logits", logits)
    if check_nan:
        _check_no_nan("logits", logits)
    seed, offset = philox_seed_offset(logits.device, generator, seed, offset)
    out = torch.empty(batch, dtype=torch.int32, device=logits.device)
    if batch:
        get_sampling_module(logits.dtype).sampling_from_logits(out, logits, index,
                                                               as_int64(seed), as_int64(offset))
    return out


@flashinfer_api
def top_p_sampling_from_probs(probs: torch.Tensor, top_p: float | torch.Tensor,
                              indices: torch.Tensor | None = None, deterministic: bool = True,
                              generator: torch.Generator | None = None, check_nan: bool = False,
                              seed: int | None = None, offset: int | None = None) -> torch.Tensor:
    """Nucleus sampling: draw from the smallest set of most likely tokens holding ``top_p``
    of the mass, renormalized. ``top_p`` in (0, 1]."""
    return _sample_probs(probs, indices, top_p=top_p, deterministic=deterministic,
                         generator=generator, check_nan=check_nan, seed=seed, offset=offset)


@flashinfer_api
def top_k_sampling_from_probs(probs: torch.Tensor, top_k: int | torch.Tensor,
                              indices: torch.Tensor | None = None, deterministic: bool = True,
                              generator: torch.Generator | None = None, check_nan: bool = False,
                              seed: int | None = None, offset: int | None = None) -> torch.Tensor:
    """Draw from the ``top_k`` most likely tokens, renormalized. ``top_k`` in [1, vocab]."""
    return _sample_probs(probs, indices, top_k=top_k, deterministic=deterministic,
                         generator=generator, check_nan=check_nan, seed=seed, offset=offset)


@flashinfer_api
def min_p_sampling_from_probs(probs: torch.Tensor, min_p: float | torch.Tensor,
                              indices: torch.Tensor | None = None, deterministic: bool = True,
                              generator: torch.Generator | None = None, check_nan: bool = False,
                              seed: int | None = None, offset: int | None = None) -> torch.Tensor:
    """Draw from the tokens with ``p >= min_p * max(p)``, renormalized. ``min_p`` in [0, 1]."""
    return _sample_probs(probs, indices, min_p=min_p, deterministic=deterministic,
                         generator=generator, check_nan=check_nan, seed=seed, offset=offset)


@flashinfer_api
def top_k_top_p_sampling_from_probs(probs: torch.Tensor, top_k: int | torch.Tensor,
                                    top_p: float | torch.Tensor,
                                    indices: torch.Tensor | None = None,
                                    filter_apply_order: str = "top_k_first",
                                    deterministic: bool = True,
                                    generator: torch.Generator | None = None,
                                    check_nan: bool = False, seed: int | None = None,
                                    offset: int | None = None) -> torch.Tensor:
    """Top-k and top-p together, in one launch. ``"top_k_first"``: top-p over the
    renormalized top-k set; ``"joint"``: tokens in both the top-k and the top-p set of the
    original distribution."""
    return _sample_probs(probs, indices, top_k=top_k, top_p=top_p,
                         top_k_first=_filter_order(filter_apply_order),
                         deterministic=deterministic, generator=generator, check_nan=check_nan,
                         seed=seed, offset=offset)


@flashinfer_api
def top_k_top_p_sampling_from_logits(logits: torch.Tensor, top_k: int | torch.Tensor,
                                     top_p: float | torch.Tensor,
                                     indices: torch.Tensor | None = None,
                                     filter_apply_order: str = "top_k_first",
                                     deterministic: bool = True,
                                     generator: torch.Generator | None = None,
                                     check_nan: bool = False, seed: int | None = None,
                                     offset: int | None = None) -> torch.Tensor:
    """:func:`softmax` then :func:`top_k_top_p_sampling_from_probs` (two launches)."""
    return _sample_probs(logits, indices, top_k=top_k, top_p=top_p,
                         top_k_first=_filter_order(filter_apply_order),
                         deterministic=deterministic, generator=generator, check_nan=check_nan,
                         seed=seed, offset=offset, from_logits=True)


@flashinfer_api
def top_p_renorm_probs(probs: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """``probs`` with the tokens outside each row's top-p set zeroed, rows renormalized."""
    _check_rows("probs", probs, _PROB_DTYPES)
    values, p = _per_request("top_p", top_p, probs.shape[0], probs, False, 0.0, 1.0, True)
    checks.check_cuda("probs", probs)
    out = torch.empty(probs.shape, dtype=torch.float32, device=probs.device)
    if probs.shape[0]:
        get_sampling_module(torch.float32).renorm_probs(out, probs, None, values, 1, float(p),
                                                        _TOP_P)
    return out


@flashinfer_api
def top_k_renorm_probs(probs: torch.Tensor, top_k: int | torch.Tensor) -> torch.Tensor:
    """``probs`` with all but each row's ``top_k`` most likely tokens zeroed (ties with
    the k-th kept), rows renormalized."""
    _check_rows("probs", probs, _PROB_DTYPES)
    values, k = _per_request("top_k", top_k, probs.shape[0], probs, True, 1, probs.shape[1],
                             False)
    checks.check_cuda("probs", probs)
    out = torch.empty(probs.shape, dtype=torch.float32, device=probs.device)
    if probs.shape[0]:
        get_sampling_module(torch.float32).renorm_probs(out, probs, values, None, int(k), 1.0,
                                                        _TOP_K)
    return out


@flashinfer_api
def top_k_mask_logits(logits: torch.Tensor, top_k: int | torch.Tensor) -> torch.Tensor:
    """``logits`` with all but each row's ``top_k`` largest set to ``-inf`` (ties with the
    k-th kept); same dtype."""
    _check_rows("logits", logits, _LOGIT_DTYPES)
    values, k = _per_request("top_k", top_k, logits.shape[0], logits, True, 1, logits.shape[1],
                             False)
    checks.check_cuda("logits", logits)
    out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    if logits.shape[0]:
        get_sampling_module(logits.dtype).top_k_mask_logits(out, logits, values, int(k))
    return out
