"""Sorting-free sampling: logits or probabilities in, token ids out.

Filters keep an upper set of each row: top-k (the k most likely tokens, ties with the k-th
kept), top-p (token j is kept iff the tokens strictly more likely than j hold less than
``top_p`` of the row's mass), min-p (``p >= min_p * max(p)``). Kernels find the set's pivot
by radix select and draw with an exponential race, without sorting the vocabulary; see
include/flashinfer/sampling.cuh.

Every per-request parameter (``top_k``, ``top_p``, ``min_p``, ``temperature``) is a Python
scalar, checked here, or a ``[batch]`` tensor on the input's device, whose values stay on
the device (no sync). Scalars: ``top_k >= 1`` (values >= vocab keep everything),
``top_p > 0`` (values >= 1 keep everything), ``min_p <= 1`` (values <= 0 keep everything),
any temperature but NaN (0 and inf give the uniform distribution, as in the reference).
Tensor values out of those ranges: ``top_k`` < 0 or >= vocab keeps everything and 0 acts as
1 (the reference reads k as unsigned), ``top_p <= 0`` and ``min_p >= 1`` keep only the most
likely tokens.

Randomness: ``seed``/``offset`` (ints, or int64/uint64 device tensors read when the kernel
runs), or a ``generator``, or the device's default CUDA generator (see
:mod:`flashinfer.rng`). The same seed and offset give the same tokens in any process. Every
kernel is deterministic, so ``deterministic`` and ``is_deterministic`` are accepted for API
compatibility and both values run the same deterministic algorithm.

``indices`` (``[batch]``, int32 or int64) maps output row i to input row ``indices[i]``,
so one distribution can be sampled several times; the tokens then have the dtype of
``indices`` (int32 without). An index outside the input's rows (64-bit indices included)
yields token -1 (device values are not read on the host). A row without any positive
probability left after filtering yields token 0; ``return_valid=True`` also returns a bool
``[batch]`` tensor that is False for such rows and for out-of-range indices.

Each kernel is a torch custom op (see docs/compile.md): ``softmax``,
``sampling_from_logits``, ``sampling_from_probs`` (every filtered sampler), ``renorm_probs``
(top-p and top-k) and ``top_k_mask_logits``, each writing its output tensors. Without
``seed`` and ``generator`` the op itself draws from the device's default CUDA generator when
it runs, so a traced or compiled graph draws new numbers on every call.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import checks
from .api_logging import flashinfer_api
from .custom_op import is_symbolic, kernel_op
from .jit.sampling import gen_sampling_module
from .pdl import resolve_enable_pdl
from .rng import as_int64, check_seed_args, philox_seed_offset
from .trace.templates import sampling as _trace

_NATIVE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # one module each
# Inputs the reference converts to float32 first (float64 included).
_FLOAT_INPUTS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TOP_K_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
_FILTER_ORDERS = ("top_k_first", "joint")
# Filter bits understood by csrc/sampling.cc.
_TOP_K, _TOP_P, _MIN_P = 1, 2, 4
_FILTER_BITS = {"top_k": _TOP_K, "top_p": _TOP_P, "min_p": _MIN_P}
# Tokens, or (tokens, valid) with return_valid=True.
Samples = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


@functools.cache
def get_sampling_module(dtype: Any = torch.float32):  # noqa: ANN201 - a tvm_ffi.Module
    """The sampling module for inputs of ``dtype`` (float32 serves probabilities too; the
    reference's takes no argument, and engines call it so to build it ahead of use)."""
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


def _native(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in a dtype with a module (float64 becomes float32, as the reference does)."""
    return tensor if tensor.dtype in _NATIVE_DTYPES else tensor.float()


def _check_indices(indices: Any, like: torch.Tensor) -> int:
    """The output batch size (``indices`` int32 or int64, values unchecked: no sync)."""
    if indices is None:
        return like.shape[0]
    checks.check_index_tensor("indices", indices, None, (torch.int32, torch.int64))
    checks.check_same_device("indices", indices, like)
    if indices.shape[0] >= 1 << 31:
        raise ValueError("indices has too many elements")
    return indices.shape[0]


def _check_flags(**flags: Any) -> None:
    for name, flag in flags.items():
        checks.check_bool(name, flag)


def _real(name: str, value: Any, expected: str) -> float:
    return checks.check_number(name, value, kind=f"{expected} or a [batch] tensor", allow_inf=True)


def _scalar_top_k(value: Any) -> int:
    checks.check_int("top_k", value, kind="an int or a [batch] tensor")
    if value < 1:
        raise ValueError(f"top_k must be >= 1 (values >= vocab_size keep every token), got {value}")
    return value


def _scalar_top_p(value: Any) -> float:
    top_p = _real("top_p", value, "a float")
    if top_p <= 0:
        raise ValueError(f"top_p must be > 0 (values >= 1 keep every token), got {value}")
    return top_p


def _scalar_min_p(value: Any) -> float:
    min_p = _real("min_p", value, "a float")
    if min_p > 1:
        raise ValueError(f"min_p must be <= 1 (values <= 0 keep every token), got {value}")
    return min_p


def _scalar_temperature(value: Any) -> float:
    return _real("temperature", value, "a float")


@dataclass(frozen=True)
class _Param:
    """A checked per-request parameter: a [batch] tensor (converted for the kernel once the
    call goes ahead), else the scalar. ``vocab``: the row length, which bounds top_k."""

    tensor: torch.Tensor | None
    scalar: float
    vocab: int = 1

    def kernel_tensor(self) -> torch.Tensor | None:
        if self.tensor is None:
            return None
        if self.tensor.dtype.is_floating_point:
            return self.tensor.to(torch.float32).contiguous()
        if self.tensor.dtype == torch.int64:  # narrowed without wrapping: k < 0 and k >= vocab
            return self.tensor.clamp(-1, self.vocab).to(torch.int32).contiguous()  # keep all
        return self.tensor.to(torch.int32).contiguous()

    def top_k(self) -> int:
        """The scalar as the kernel's k (at most the row length)."""
        return int(min(self.scalar, self.vocab))


_SCALAR_CHECKS: dict[str, Callable[[Any], float]] = {
    "top_k": _scalar_top_k,
    "top_p": _scalar_top_p,
    "min_p": _scalar_min_p,
    "temperature": _scalar_temperature,
}


def _per_request(name: str, value: Any, batch: int, like: torch.Tensor) -> _Param:
    """A scalar (checked) or a [batch] tensor; ``None`` is refused, never "no filter"."""
    vocab = like.shape[1]
    if not isinstance(value, torch.Tensor):
        return _Param(None, _SCALAR_CHECKS[name](value), vocab)
    checks.check_ndim(name, value, 1, "[batch] per-request tensor")
    if value.shape[0] != batch:
        raise ValueError(f"{name} has {value.shape[0]} elements, the batch has {batch}")
    if name == "top_k":
        checks.check_dtype(name, value, _TOP_K_DTYPES)
    elif not value.dtype.is_floating_point:
        raise TypeError(f"{name} has dtype {value.dtype}; expected a floating-point tensor")
    checks.check_same_device(name, value, like)
    return _Param(value, 1 if name == "top_k" else 0.0, vocab)


def _check_seed_tensors(seed: Any, offset: Any, batch: int, like: torch.Tensor) -> None:
    """Length and device of seed/offset tensors (their dtype and rank: rng.check_seed_args)."""
    for name, value in (("seed", seed), ("offset", offset)):
        if isinstance(value, torch.Tensor):
            if value.shape[0] not in (1, batch):
                raise ValueError(f"{name} has {value.shape[0]} elements; expected 1 or {batch}")
            checks.check_same_device(name, value, like)


def _words_per_row(vocab: int) -> int:
    """Philox words (generator offsets) one row draws: one per element, in blocks of 4."""
    return 4 * ((vocab + 3) // 4)


# What a sampling op draws with: (seed_values, offset_values, seed, offset), the tensors or the
# ints (int64) set, or all None: draw from the default generator when the op runs.
_Position = tuple[torch.Tensor | None, torch.Tensor | None, int | None, int | None]


def _drawn(x: torch.Tensor, generator: Any, seed: Any, offset: Any) -> _Position:
    """The position of ``seed``/``offset`` (ints), else of ``generator`` (the device's default
    one if None), which is read and advanced now (see :mod:`flashinfer.rng`)."""
    seed, offset = philox_seed_offset(x.device, generator, seed, offset, _words_per_row(x.shape[1]))
    if isinstance(seed, torch.Tensor):
        return seed, offset, None, None
    return None, None, as_int64(seed), as_int64(offset)


def _stream_position(x: torch.Tensor, generator: Any, seed: Any, offset: Any) -> _Position:
    """The checked random arguments as the op takes them. Tensors and ints pass through; a
    generator is read on the host now, which a graph traced with fake tensors would bake in,
    so that is refused (dynamo instead breaks the graph there and reads it each call); with
    neither, the op draws from the default generator when it runs, in eager and in graphs."""
    if isinstance(seed, torch.Tensor):
        return seed, offset, None, None
    if seed is None:
        if generator is None:
            return None, None, None, None
        if is_symbolic(x) and not torch.compiler.is_compiling():
            raise ValueError(
                "generator is read when the call is made, so a graph traced with fake tensors "
                "would repeat one draw: pass seed and offset tensors, or no generator (the "
                "default CUDA generator is then read each time the graph runs)"
            )
    return _drawn(x, generator, seed, offset)


def _draw_if_unset(x: torch.Tensor, position: _Position) -> _Position:
    """In an op: ``position``, or the default generator's when none was set."""
    if position[0] is None and position[2] is None:
        return _drawn(x, None, None, None)
    return position


def _binding_position(position: _Position) -> tuple[Any, ...]:
    """The binding's (seed_values, offset_values, seed, offset): unused ints as 0."""
    seed_values, offset_values, seed, offset = position
    return seed_values, offset_values, seed or 0, offset or 0


def _outputs(
    batch: int, indices: torch.Tensor | None, device: torch.device, return_valid: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = torch.empty(batch, dtype=torch.int32 if indices is None else indices.dtype, device=device)
    valid = torch.empty(batch, dtype=torch.bool, device=device) if return_valid else None
    return out, valid


def _check_no_nan(name: str, tensor: torch.Tensor) -> None:
    """Host-synchronizing NaN check, only when the caller asked for it."""
    if bool(torch.isnan(tensor).any()):
        raise ValueError(f"{name} contains NaN")


def _nan_check_in_op(name: str, tensor: torch.Tensor, check_nan: bool) -> bool:
    """With ``check_nan``, checks ``tensor`` now, or while tracing (values unknown) returns
    True: the op checks its input when it runs."""
    if not check_nan:
        return False
    if is_symbolic(tensor):
        return True
    _check_no_nan(name, tensor)
    return False


@kernel_op("softmax", mutates_args=("out",))
def _softmax_op(
    out: torch.Tensor,
    logits: torch.Tensor,
    temperature: torch.Tensor | None,
    temperature_value: float,
    enable_pdl: bool | None,
) -> None:
    if logits.shape[0]:
        get_sampling_module(logits.dtype).softmax(
            out,
            logits,
            temperature,
            temperature_value,
            resolve_enable_pdl(enable_pdl, logits.device),
        )


@kernel_op("sampling_from_logits", mutates_args=("out",))
def _sampling_from_logits_op(
    out: torch.Tensor,
    logits: torch.Tensor,
    indices: torch.Tensor | None,
    seed_values: torch.Tensor | None,
    offset_values: torch.Tensor | None,
    seed: int | None,
    offset: int | None,
    check_nan: bool,
) -> None:
    if check_nan:
        _check_no_nan("logits", logits)
    position = _draw_if_unset(logits, (seed_values, offset_values, seed, offset))
    if not out.shape[0]:
        return
    get_sampling_module(logits.dtype).sampling_from_logits(
        out, logits, indices, *_binding_position(position)
    )


@kernel_op("sampling_from_probs", mutates_args=("out", "valid"))
def _sampling_from_probs_op(
    out: torch.Tensor,
    valid: torch.Tensor | None,
    probs: torch.Tensor,
    indices: torch.Tensor | None,
    top_k_values: torch.Tensor | None,
    top_p_values: torch.Tensor | None,
    min_p_values: torch.Tensor | None,
    top_k: int,
    top_p: float,
    min_p: float,
    filters: int,
    top_k_first: bool,
    seed_values: torch.Tensor | None,
    offset_values: torch.Tensor | None,
    seed: int | None,
    offset: int | None,
    check_nan: bool,
) -> None:
    if check_nan:
        _check_no_nan("probs", probs)
    position = _draw_if_unset(probs, (seed_values, offset_values, seed, offset))
    if not out.shape[0]:
        return
    get_sampling_module(torch.float32).sampling_from_probs(
        out,
        valid,
        probs,
        indices,
        top_k_values,
        top_p_values,
        min_p_values,
        top_k,
        top_p,
        min_p,
        filters,
        top_k_first,
        *_binding_position(position),
    )


@kernel_op("renorm_probs", mutates_args=("out",))
def _renorm_probs_op(
    out: torch.Tensor,
    probs: torch.Tensor,
    top_k_values: torch.Tensor | None,
    top_p_values: torch.Tensor | None,
    top_k: int,
    top_p: float,
    filters: int,
) -> None:
    if probs.shape[0]:
        get_sampling_module(probs.dtype).renorm_probs(
            out, probs, top_k_values, top_p_values, top_k, top_p, filters
        )


@kernel_op("top_k_mask_logits", mutates_args=("out",))
def _top_k_mask_logits_op(
    out: torch.Tensor, logits: torch.Tensor, top_k_values: torch.Tensor | None, top_k: int
) -> None:
    if logits.shape[0]:
        get_sampling_module(logits.dtype).top_k_mask_logits(out, logits, top_k_values, top_k)


def _filter_order(filter_apply_order: Any) -> bool:
    if filter_apply_order not in _FILTER_ORDERS:
        raise ValueError(
            f"filter_apply_order must be one of {', '.join(_FILTER_ORDERS)}, "
            f"got {filter_apply_order!r}"
        )
    return filter_apply_order == "top_k_first"


def _sample_probs(
    probs: torch.Tensor,
    indices: Any,
    filters: dict[str, Any],
    *,
    top_k_first: bool = True,
    deterministic: Any = True,
    generator: Any = None,
    check_nan: Any = False,
    seed: Any = None,
    offset: Any = None,
    return_valid: Any = False,
    from_logits: bool = False,
) -> Any:
    """The one filtered sampling path: validate everything, then one sampling launch
    (``from_logits``: ``probs`` holds logits, turned into probabilities by :func:`softmax`
    first). ``filters``: the function's filters by name (top_k, top_p, min_p), as passed."""
    name = "logits" if from_logits else "probs"
    _check_rows(name, probs, _FLOAT_INPUTS)
    _check_flags(deterministic=deterministic, check_nan=check_nan, return_valid=return_valid)
    batch = _check_indices(indices, probs)
    params = {key: _per_request(key, value, batch, probs) for key, value in filters.items()}
    check_seed_args(generator, seed, offset)
    _check_seed_tensors(seed, offset, batch, probs)
    checks.check_cuda(name, probs)
    nan_in_op = _nan_check_in_op(name, probs, check_nan)
    probs = softmax(probs) if from_logits else probs.float()
    position = _stream_position(probs, generator, seed, offset)
    out, valid = _outputs(batch, indices, probs.device, return_valid)
    top_k = params.get("top_k", _Param(None, 1))
    top_p = params.get("top_p", _Param(None, 1.0))
    min_p = params.get("min_p", _Param(None, 0.0))
    which = sum(bit for key, bit in _FILTER_BITS.items() if key in params)
    _sampling_from_probs_op(
        out,
        valid,
        probs,
        indices,
        top_k.kernel_tensor(),
        top_p.kernel_tensor(),
        min_p.kernel_tensor(),
        top_k.top_k(),
        float(top_p.scalar),
        float(min_p.scalar),
        which,
        top_k_first,
        *position,
        nan_in_op,
    )
    return (out, valid) if return_valid else out


@flashinfer_api(trace=_trace.softmax_trace)
def softmax(
    logits: torch.Tensor,
    temperature: float | torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``softmax(logits / temperature)`` over each row, as float32 ``[batch, vocab]``
    (temperature 0, like inf, gives the uniform distribution over the finite logits, as the
    reference does). ``enable_pdl`` (default: on sm90+) lets the kernel launch while the
    previous one drains (programmatic dependent launch)."""
    _check_rows("logits", logits, _FLOAT_INPUTS)
    temp = (
        _Param(None, 1.0)
        if temperature is None
        else _per_request("temperature", temperature, logits.shape[0], logits)
    )
    checks.check_optional_bool("enable_pdl", enable_pdl)
    checks.check_cuda("logits", logits)
    logits = _native(logits)
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    _softmax_op(out, logits, temp.kernel_tensor(), float(temp.scalar), enable_pdl)
    return out


@flashinfer_api(trace=_trace.sampling_from_logits_trace)
def sampling_from_logits(
    logits: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row drawn from ``softmax(logits)`` in a single pass (Gumbel-max: no
    softmax is materialized). ``-inf`` logits are never drawn."""
    _check_rows("logits", logits, _FLOAT_INPUTS)
    _check_flags(deterministic=deterministic, check_nan=check_nan)
    batch = _check_indices(indices, logits)
    check_seed_args(generator, seed, offset)
    _check_seed_tensors(seed, offset, batch, logits)
    checks.check_cuda("logits", logits)
    nan_in_op = _nan_check_in_op("logits", logits, check_nan)
    logits = _native(logits)
    position = _stream_position(logits, generator, seed, offset)
    out, _ = _outputs(batch, indices, logits.device, False)
    _sampling_from_logits_op(out, logits, indices, *position, nan_in_op)
    return out


@flashinfer_api(trace=_trace.sampling_from_probs_trace)
def sampling_from_probs(
    probs: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
) -> Samples:
    """One token per row of ``probs`` (``[batch, vocab]``, non-negative; rows need not be
    normalized), drawn with probability ``p / sum(p)``."""
    return _sample_probs(
        probs,
        indices,
        {},
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
        return_valid=return_valid,
    )


@flashinfer_api(trace=_trace.top_p_sampling_from_probs_trace)
def top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_p: float | torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
) -> Samples:
    """Nucleus sampling: draw from the smallest set of most likely tokens holding ``top_p``
    of the mass, renormalized."""
    return _sample_probs(
        probs,
        indices,
        {"top_p": top_p},
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
        return_valid=return_valid,
    )


@flashinfer_api(trace=_trace.top_k_sampling_from_probs_trace)
def top_k_sampling_from_probs(
    probs: torch.Tensor,
    top_k: int | torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
) -> Samples:
    """Draw from the ``top_k`` most likely tokens, renormalized."""
    return _sample_probs(
        probs,
        indices,
        {"top_k": top_k},
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
        return_valid=return_valid,
    )


@flashinfer_api(trace=_trace.min_p_sampling_from_probs_trace)
def min_p_sampling_from_probs(
    probs: torch.Tensor,
    min_p: float | torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
) -> Samples:
    """Draw from the tokens with ``p >= min_p * max(p)``, renormalized."""
    return _sample_probs(
        probs,
        indices,
        {"min_p": min_p},
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
        return_valid=return_valid,
    )


@flashinfer_api(trace=_trace.top_k_top_p_sampling_from_probs_trace)
def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k: int | torch.Tensor,
    top_p: float | torch.Tensor,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
) -> Samples:
    """Top-k and top-p together, in one launch. ``"top_k_first"``: top-p over the
    renormalized top-k set; ``"joint"``: tokens in both the top-k and the top-p set of the
    original distribution."""
    return _sample_probs(
        probs,
        indices,
        {"top_k": top_k, "top_p": top_p},
        top_k_first=_filter_order(filter_apply_order),
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
        return_valid=return_valid,
    )


@flashinfer_api(trace=_trace.top_k_top_p_sampling_from_logits_trace)
def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,
    top_k: int | torch.Tensor,
    top_p: float | torch.Tensor,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`softmax` then :func:`top_k_top_p_sampling_from_probs` (two launches)."""
    return _sample_probs(
        logits,
        indices,
        {"top_k": top_k, "top_p": top_p},
        top_k_first=_filter_order(filter_apply_order),
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
        from_logits=True,
    )


def _row_op(
    name: str,
    x: torch.Tensor,
    dtype: torch.dtype,
    launch: Callable[[torch.Tensor, torch.Tensor], None],
) -> torch.Tensor:
    """A [batch, vocab] op of the renorm/mask kind, after its checks: ``x`` as ``dtype``,
    ``launch(out, x)`` into a new ``dtype`` output."""
    checks.check_cuda(name, x)
    x = x.to(dtype)
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    launch(out, x)
    return out


@flashinfer_api(trace=_trace.top_p_renorm_probs_trace)
def top_p_renorm_probs(
    probs: torch.Tensor, top_p: float | torch.Tensor, is_deterministic: bool = False
) -> torch.Tensor:
    """``probs`` with the tokens outside each row's top-p set zeroed, rows renormalized
    (float32, as the reference returns)."""
    _check_rows("probs", probs, _FLOAT_INPUTS)
    param = _per_request("top_p", top_p, probs.shape[0], probs)
    _check_flags(is_deterministic=is_deterministic)
    return _row_op(
        "probs",
        probs,
        torch.float32,
        lambda out, x: _renorm_probs_op(
            out, x, None, param.kernel_tensor(), 1, float(param.scalar), _TOP_P
        ),
    )


@flashinfer_api(trace=_trace.top_k_renorm_probs_trace)
def top_k_renorm_probs(
    probs: torch.Tensor, top_k: int | torch.Tensor, is_deterministic: bool = False
) -> torch.Tensor:
    """``probs`` with all but each row's ``top_k`` most likely tokens zeroed (ties with
    the k-th kept), rows renormalized; same dtype."""
    _check_rows("probs", probs, _NATIVE_DTYPES)
    param = _per_request("top_k", top_k, probs.shape[0], probs)
    _check_flags(is_deterministic=is_deterministic)
    return _row_op(
        "probs",
        probs,
        probs.dtype,
        lambda out, x: _renorm_probs_op(
            out, x, param.kernel_tensor(), None, param.top_k(), 1.0, _TOP_K
        ),
    )


@flashinfer_api(trace=_trace.top_k_mask_logits_trace)
def top_k_mask_logits(logits: torch.Tensor, top_k: int | torch.Tensor) -> torch.Tensor:
    """``logits`` with all but each row's ``top_k`` largest set to ``-inf`` (ties with the
    k-th kept); same dtype."""
    _check_rows("logits", logits, _NATIVE_DTYPES)
    param = _per_request("top_k", top_k, logits.shape[0], logits)
    return _row_op(
        "logits",
        logits,
        logits.dtype,
        lambda out, x: _top_k_mask_logits_op(out, x, param.kernel_tensor(), param.top_k()),
    )


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference's rejection sampling of a draft model's token chains: this library has
    no kernel for it. It exists with the reference's signature because engines import it
    with the samplers (TensorRT-LLM's speculative decoding does when it loads); a call
    raises NotImplementedError before it reads anything (so it is no traced or logged API:
    it launches nothing)."""
    raise NotImplementedError(
        "chain_speculative_sampling: this library has no speculative-sampling kernel; "
        "verify draft tokens with the engine's own rejection sampler"
    )


# Deprecated names the reference keeps.
top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs
