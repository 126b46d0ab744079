"""Kernel-launch debug printer: instruments every call into a JIT module's functions.

FLASHINFER_DEBUG_PRINTER is read when a module is loaded:

- 0: off; the loader returns the module itself (no wrapper, no overhead)
- 1 (save): every tensor argument saved before and after each launch to
  ``FLASHINFER_DEBUG_PRINTER_DIR/<before_launch|after_launch>_<kernel>_<arg>_<device>.pt``,
  the device as torch prints it (``cuda:0``, ``cpu``) as in PyTorch's AOTI debug printer;
  each save is logged (``flashinfer.debug_printer`` logger, INFO) with its path
- 2 (print): every argument printed before and after each launch (tensor statistics,
  and the values of tensors with at most 64 elements)
- 3 (kernel names only): ``[ before_launch: <kernel> ]``, the launch, a device
  synchronize, ``[ after_launch: <kernel> ]``; after an illegal memory access the last
  ``before_launch`` without its ``after_launch`` names the faulty kernel, and the CUDA
  error surfaces at that kernel, not a later one.

A kernel is ``<module name>.<function>``; FLASHINFER_DEBUG_PRINTER_KERNELS (comma list,
case-insensitive, full or bare names) selects which are instrumented. Output follows
FLASHINFER_LOGDEST. During CUDA graph capture nothing synchronizes or copies: a note says so.
The printer never breaks the launch it watches: a save directory that cannot be written
is reported once and saving stops (level 3 still raises the kernel's CUDA error: that is
its purpose).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from .config import config
from .logdest import Destination, safe_filename, warn_once
from .tensor_format import dtype_name, format_value, graph_capture_in_progress, tensor_stats

logger = logging.getLogger("flashinfer.debug_printer")

MAX_VALUES = 64
_CAPTURE_NOTE = "CUDA graph capture in progress: no synchronize, statistics or saves"


def synchronize(args: Sequence[Any]) -> None:
    """Wait for the devices of the CUDA tensors among ``args`` (raises their errors)."""
    devices = {a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"}
    for device in devices:
        torch.cuda.synchronize(device)


def _describe_tensor_line(t: torch.Tensor, capture: bool) -> list[str]:
    parts = [
        f"numel={t.numel()}",
        f"shape={tuple(t.shape)}",
        f"dtype={dtype_name(t.dtype)}",
        f"device={t.device}",
    ]
    if capture:
        return [", ".join(parts)]
    try:
        stats = tensor_stats(t, with_std=True)
    except Exception as err:  # noqa: BLE001 - statistics never stop the launch
        return [", ".join(parts), f"    [statistics error: {type(err).__name__}: {str(err)[:150]}]"]
    order = ("mean", "min", "max", "std", "nan_count", "inf_count", "true_count", "false_count")
    parts += [
        f"{k}={stats[k]:.6g}" if isinstance(stats[k], float) else f"{k}={stats[k]}"
        for k in order
        if k in stats
    ]
    lines = [", ".join(parts)]
    if 0 < t.numel() <= MAX_VALUES:
        lines.append(f"    values: {t.detach().cpu().tolist()}")
    return lines


def save_name(phase: str, kernel: str, arg: str, device: torch.device) -> str:
    """``<phase>_<kernel>_<arg>_<device>.pt``; the device as torch prints it (``cuda:0``)."""
    return f"{phase}_{safe_filename(kernel)}_{safe_filename(arg)}_{device}.pt"


class LaunchPrinter:
    """Instruments module functions for one level, kernel filter, destination and dir."""

    def __init__(
        self,
        level: int,
        kernels: Sequence[str] = (),
        dest: Destination | None = None,
        directory: Path = Path("flashinfer_debug"),
    ) -> None:
        self.level = level
        self.kernels = {k.lower() for k in kernels}
        self.dest = dest or Destination("stdout")
        self.directory = Path(directory)
        self._saves_failed = False

    @classmethod
    def from_config(cls) -> LaunchPrinter:
        return cls(
            config.debug_printer,
            config.debug_printer_kernels,
            Destination(config.api_log_dest),
            config.debug_printer_dir,
        )

    def selects(self, kernel: str) -> bool:
        if not self.kernels:
            return True
        return kernel.lower() in self.kernels or kernel.rsplit(".", 1)[-1].lower() in self.kernels

    def instrument(
        self, module: Any, module_name: str, arg_names: Mapping[str, Sequence[str]] | None = None
    ) -> Any:
        if self.level == 0:
            return module
        return InstrumentedModule(module, module_name, self, dict(arg_names or {}))

    def wrap(
        self, kernel: str, func: Callable[..., Any], names: Sequence[str]
    ) -> Callable[..., Any]:
        if self.level == 0 or not self.selects(kernel):
            return func

        def arg_name(index: int) -> str:
            return names[index] if index < len(names) else f"arg{index}"

        if self.level == 3:

            def launch(*args: Any) -> Any:
                self.dest.write(f"[ before_launch: {kernel} ]")
                result = func(*args)
                if graph_capture_in_progress():
                    self.dest.write(f"[ after_launch: {kernel} ] ({_CAPTURE_NOTE})")
                else:
                    synchronize(args)
                    self.dest.write(f"[ after_launch: {kernel} ]")
                return result
        else:
            report = self._save if self.level == 1 else self._print

            def launch(*args: Any) -> Any:
                report("before_launch", kernel, args, arg_name)
                result = func(*args)
                report("after_launch", kernel, args, arg_name)
                return result

        launch.__name__ = kernel.rsplit(".", 1)[-1]
        launch.__qualname__ = kernel
        launch.__wrapped__ = func  # type: ignore[attr-defined]
        return launch

    def _print(
        self, phase: str, kernel: str, args: Sequence[Any], arg_name: Callable[[int], str]
    ) -> None:
        capture = graph_capture_in_progress()
        lines = [f"[ {phase}: {kernel} ] ({_CAPTURE_NOTE})"] if capture else []
        if not args:
            lines.append(f"[ {phase}: {kernel} ] (no arguments)")
        for index, value in enumerate(args):
            prefix = f"[ {phase}: {kernel} ] {arg_name(index)}: "
            if isinstance(value, torch.Tensor):
                described = _describe_tensor_line(value, capture)
                lines.append(prefix + described[0])
                lines += described[1:]
            else:
                lines.append(prefix + format_value(value))
        self.dest.write("\n".join(lines))

    def _save(
        self, phase: str, kernel: str, args: Sequence[Any], arg_name: Callable[[int], str]
    ) -> None:
        if graph_capture_in_progress():
            self.dest.write(f"[ {phase}: {kernel} ] not saved ({_CAPTURE_NOTE})")
            return
        for index, value in enumerate(args):
            if isinstance(value, torch.Tensor) and not self._saves_failed:
                arg = arg_name(index)
                self._write(
                    value.detach().cpu().clone(),
                    kernel,
                    arg,
                    save_name(phase, kernel, arg, value.device),
                )

    def _write(self, tensor: torch.Tensor, kernel: str, arg: str, name: str) -> None:
        """Save one tensor; an unwritable directory stops saving with one warning (the copy
        to the host stays outside: a CUDA error it raises belongs to the launch)."""
        path = self.directory / name
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            torch.save(tensor, path)
            logger.info("Saved intermediate tensor %s for %s to %s", arg, kernel, path)
        except (OSError, RuntimeError) as err:  # torch.save reports write errors as RuntimeError
            self._saves_failed = True
            warn_once(
                f"debug_printer_dir:{self.directory}",
                f"cannot save tensors to FLASHINFER_DEBUG_PRINTER_DIR={self.directory} "
                f"({type(err).__name__}: {err}); the debug printer stops saving",
            )


class InstrumentedModule:
    """A loaded module whose exported functions go through a LaunchPrinter."""

    def __init__(
        self, module: Any, name: str, printer: LaunchPrinter, arg_names: dict[str, Sequence[str]]
    ) -> None:
        self._module = module
        self._name = name
        self._printer = printer
        self._arg_names = arg_names

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._module, attr)
        if attr.startswith("_") or not callable(value):
            return value
        wrapped = self._printer.wrap(f"{self._name}.{attr}", value, self._arg_names.get(attr, ()))
        setattr(self, attr, wrapped)  # wrap each function once
        return wrapped

    def __repr__(self) -> str:
        return f"<instrumented {self._module!r} (debug printer level {self._printer.level})>"
