"""``TraceTemplate``: an API's flashinfer-bench definition, described once, filled from shapes.

A template names the axes of an operation (``Var``: changes from call to call, e.g. the
batch size; ``Const``: fixed per compiled kernel, e.g. the head dim), its inputs and outputs
as lists of axis names, and the torch reference the GPU tests compare against. Given the
arguments of one call it produces the definition dict: axis values come from the tensors'
shapes (``.shape`` and ``.dtype`` only, so CPU, meta, FakeTensorMode and CUDA tensors all
work and no data is read), dtypes from the tensors.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Union

import torch

Kwargs = dict[str, Any]

_REFERENCE_PREAMBLE = "from __future__ import annotations\n\nimport math\n\nimport torch\n\n"


@dataclass(frozen=True)
class Var:
    """An axis whose size may change from call to call without recompiling."""

    description: str = ""


@dataclass(frozen=True)
class Const:
    """An axis fixed per kernel specialization; its value is part of the definition's name.

    ``abbrev``: the name prefix of its value (``h`` gives ``h4096``); ``None`` uses the
    axis name, ``""`` leaves the axis out of the name.
    """

    description: str = ""
    abbrev: str | None = None


@dataclass(frozen=True)
class Tensor:
    """A tensor input or output, one axis name per dimension.

    ``param``: the API parameter holding it (default: the entry's key). ``tuple_idx``: its
    index in a ``(k, v)`` tuple parameter; a single 5-D paged cache tensor
    ``[pages, 2, ...]`` is split the same way. ``hnd_dims``: the dims when the call's
    ``kv_layout`` is ``"HND"``. Outputs take their dtype from ``dtype`` or from the
    input parameter ``dtype_from``. ``flatten_leading``: a call may pass more leading dims
    than ``dims`` names (norms take ``[..., hidden]``); they count as the first axis.
    """

    dims: tuple[str, ...]
    param: str | None = None
    tuple_idx: int | None = None
    dtype: str | None = None
    dtype_from: str | None = None
    optional: bool = False
    description: str = ""
    hnd_dims: tuple[str, ...] | None = None
    flatten_leading: bool = False

    def sizes(self, value: torch.Tensor) -> tuple[int, ...]:
        """``value``'s shape as ``dims`` reads it."""
        shape = tuple(int(n) for n in value.shape)
        extra = len(shape) - len(self.dims)
        if self.flatten_leading and extra > 0:
            return (math.prod(shape[: extra + 1]), *shape[extra + 1 :])
        return shape

    def dims_for(self, kwargs: Kwargs) -> tuple[str, ...]:
        if self.hnd_dims is not None and kwargs.get("kv_layout") == "HND":
            return self.hnd_dims
        return self.dims


@dataclass(frozen=True)
class Scalar:
    """A non-tensor input (a float or int argument); ``shape`` is ``null`` in the JSON."""

    dtype: str = "float32"
    param: str | None = None
    optional: bool = False
    description: str = ""


Descriptor = Union[Tensor, Scalar]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (flashinfer-bench's spelling)."""
    return str(dtype).removeprefix("torch.")


def _lookup(kwargs: Kwargs, key: str, desc: Descriptor) -> Any:
    value = kwargs.get(desc.param or key)
    if isinstance(desc, Tensor) and desc.tuple_idx is not None:
        if isinstance(value, (tuple, list)):
            value = value[desc.tuple_idx] if len(value) > desc.tuple_idx else None
        elif isinstance(value, torch.Tensor) and value.dim() == 5:
            value = value.select(1, desc.tuple_idx)  # [pages, 2, ...]: a view, no data read
    return value


def module_constants(module: ModuleType, names: tuple[str, ...]) -> str:
    """The one-line assignments of ``names`` in ``module``'s source, for ``reference_deps``."""
    lines = inspect.getsource(module).splitlines()
    return "\n".join(line for line in lines if line.split(" ")[0] in names) + "\n"


def render_reference(fn: Callable[..., Any], deps: tuple[Callable[..., Any] | str, ...]) -> str:
    """Standalone source of ``fn``: imports, the helpers it calls (``deps``: functions, or
    source text such as :func:`module_constants`), then ``fn``."""
    parts = [_REFERENCE_PREAMBLE]
    parts += [(dep if isinstance(dep, str) else inspect.getsource(dep)) + "\n\n" for dep in deps]
    parts.append(inspect.getsource(fn))
    return "".join(parts)


@dataclass
class TraceTemplate:
    """The schema of one API's flashinfer-bench definition.

    ``reference``: the torch function the GPU tests compare against (from
    ``flashinfer.testing.reference``), its source embedded in the definition;
    ``reference_deps``: the module-level helpers it calls, embedded before it.
    ``plan_attrs``: for wrapper ``run`` methods, ``{parameter: attribute}`` read from the
    wrapper instance (what ``plan()`` stored) when ``fi_trace`` is given a bound method.
    ``derived``: ``{axis: f(axis values)}`` for an axis no tensor carries alone (e.g. half
    an input's width); used when the call gives no tensor with it.
    """

    op_type: str
    axes: dict[str, Var | Const]
    inputs: dict[str, Descriptor]
    outputs: dict[str, Descriptor]
    name_prefix: str | None = None
    description: str = ""
    tags: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    reference: Callable[..., Any] | None = None
    reference_deps: tuple[Callable[..., Any] | str, ...] = ()
    plan_attrs: dict[str, str] = field(default_factory=dict)
    derived: dict[str, Callable[[dict[str, int]], int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = set(self.axes)
        for key, desc in {**self.inputs, **self.outputs}.items():
            if isinstance(desc, Tensor):
                unknown = (set(desc.dims) | set(desc.hnd_dims or ())) - known
                if unknown:
                    raise ValueError(
                        f"{self.op_type}: {key} uses undeclared axes {sorted(unknown)}"
                    )

    # -- axis values -----------------------------------------------------------------------

    def axis_values(self, kwargs: Kwargs) -> dict[str, int]:
        """Each axis's size as the first tensor carrying it shows it (required tensors
        first), else an int argument named after it."""
        found: dict[str, int] = {}
        ordered = sorted(self.inputs.items(), key=lambda kv: getattr(kv[1], "optional", False))
        for key, desc in [*ordered, *self.outputs.items()]:
            if not isinstance(desc, Tensor):
                continue
            value = _lookup(kwargs, key, desc)
            if not isinstance(value, torch.Tensor):
                continue
            sizes = desc.sizes(value)
            for dim, axis in enumerate(desc.dims_for(kwargs)):
                if dim < len(sizes):
                    found.setdefault(axis, sizes[dim])
        for axis in self.axes:
            value = kwargs.get(axis)
            if axis not in found and isinstance(value, int) and not isinstance(value, bool):
                found[axis] = value
        for axis, derive in self.derived.items():
            if axis not in found:
                with contextlib.suppress(KeyError):
                    found[axis] = derive(found)
        return {axis: found[axis] for axis in self.axes if axis in found}

    def const_values(self, kwargs: Kwargs) -> tuple[tuple[str, int], ...]:
        values = self.axis_values(kwargs)
        return tuple(
            (a, values[a]) for a, m in self.axes.items() if isinstance(m, Const) and a in values
        )

    def definition_name(self, axis_values: dict[str, int]) -> str:
        """``<name_prefix or op_type>_<abbrev><value>...`` over the const axes."""
        parts = []
        for axis, marker in self.axes.items():
            if isinstance(marker, Const) and axis in axis_values and marker.abbrev != "":
                prefix = axis if marker.abbrev is None else marker.abbrev
                parts.append(f"{prefix}{axis_values[axis]}")
        return "_".join([self.name_prefix or self.op_type, *parts])

    # -- the definition --------------------------------------------------------------------

    def _input_entry(self, key: str, desc: Descriptor, kwargs: Kwargs) -> dict[str, Any]:
        if isinstance(desc, Scalar):
            value = _lookup(kwargs, key, desc)
            dtype = dtype_name(value.dtype) if isinstance(value, torch.Tensor) else desc.dtype
            entry: dict[str, Any] = {"shape": None, "dtype": dtype}
        else:
            value = _lookup(kwargs, key, desc)
            dtype = (
                dtype_name(value.dtype)
                if isinstance(value, torch.Tensor)
                else desc.dtype or "unknown"
            )
            entry = {"shape": list(desc.dims_for(kwargs)), "dtype": dtype}
        return self._finish(entry, desc)

    def _output_entry(self, key: str, desc: Descriptor, kwargs: Kwargs) -> dict[str, Any]:
        if isinstance(desc, Scalar):
            return self._finish({"shape": None, "dtype": desc.dtype}, desc)
        dtype = desc.dtype
        if desc.dtype_from is not None:
            source = self.inputs.get(desc.dtype_from, Tensor((), param=desc.dtype_from))
            value = _lookup(kwargs, desc.dtype_from, source)
            if isinstance(value, torch.Tensor):
                dtype = dtype_name(value.dtype)
        return self._finish(
            {"shape": list(desc.dims_for(kwargs)), "dtype": dtype or "unknown"}, desc
        )

    @staticmethod
    def _finish(entry: dict[str, Any], desc: Descriptor) -> dict[str, Any]:
        if desc.optional:
            entry["optional"] = True
        if desc.description:
            entry["description"] = desc.description
        return entry

    def definition(self, fi_api: str, kwargs: Kwargs) -> dict[str, Any]:
        """The flashinfer-bench definition of a call with ``kwargs`` (parameter -> value)."""
        values = self.axis_values(kwargs)
        axes: dict[str, Any] = {}
        for axis, marker in self.axes.items():
            entry: dict[str, Any] = {"type": "const" if isinstance(marker, Const) else "var"}
            if isinstance(marker, Const) and axis in values:
                entry["value"] = values[axis]
            if marker.description:
                entry["description"] = marker.description
            axes[axis] = entry
        result: dict[str, Any] = {
            "name": self.definition_name(values),
            "description": self.description,
            "op_type": self.op_type,
            "tags": [f"fi_api:{fi_api}", *self.tags],
            "axes": axes,
        }
        if self.constraints:
            result["constraints"] = list(self.constraints)
        result["inputs"] = {k: self._input_entry(k, d, kwargs) for k, d in self.inputs.items()}
        result["outputs"] = {k: self._output_entry(k, d, kwargs) for k, d in self.outputs.items()}
        if self.reference is not None:
            result["reference"] = render_reference(self.reference, self.reference_deps)
        return result
