"""PEP 517 build backend for flashinfer, using only the standard library.

- Wheels carry the Python package plus ``csrc/`` and ``include/`` copied into
  ``flashinfer/data/`` (the JIT compiles from there; nothing is ever written there).
- Editable installs put a ``.pth`` pointing at the checkout on ``sys.path`` and link
  ``flashinfer/data/{csrc,include}`` to the checkout's directories, so edits to
  headers and sources are seen by the next JIT build.
- No build requirements: nothing is fetched to build, which matters offline.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PACKAGE = "flashinfer"
DATA_DIRS = ("csrc", "include", "3rdparty")
_SKIP_PARTS = {"__pycache__", "data"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _version() -> str:
    text = (ROOT / PACKAGE / "version.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if not match:
        raise RuntimeError("no __version__ in flashinfer/version.py")
    return match[1]


def _dist_name() -> str:
    return f"{PACKAGE}-{_version()}"


def _metadata() -> str:
    project = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {_version()}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '>=3.11')}",
    ]
    lines += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {dep}; extra == "{extra}"' for dep in deps]
    readme = ROOT / "README.md"
    if readme.is_file():
        lines += ["Description-Content-Type: text/markdown", "", readme.read_text()]
    return "\n".join(lines) + "\n"


def _entry_points() -> str:
    scripts = _project().get("scripts", {})
    if not scripts:
        return ""
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())


class _WheelWriter:
    """Writes a wheel and its RECORD."""

    def __init__(self, path: Path) -> None:
        self._zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self._records: list[str] = []

    def add(self, arcname: str, data: bytes) -> None:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self._zip.writestr(info, data)
        self._records.append(f"{arcname},sha256={digest},{len(data)}")

    def close(self, dist_info: str) -> None:
        self._records.append(f"{dist_info}/RECORD,,")
        self._zip.writestr(f"{dist_info}/RECORD", "\n".join(self._records) + "\n")
        self._zip.close()


def _package_files() -> list[Path]:
    files = []
    for path in sorted((ROOT / PACKAGE).rglob("*")):
        rel = path.relative_to(ROOT / PACKAGE)
        if path.is_file() and not _SKIP_PARTS.intersection(rel.parts) and path.suffix != ".pyc":
            files.append(path)
    return files


def _data_files() -> list[tuple[Path, str]]:
    out = []
    for name in DATA_DIRS:
        base = ROOT / name
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                out.append((path, f"{PACKAGE}/data/{path.relative_to(ROOT)}"))
    return out


def _write_wheel(wheel_directory: str, editable: bool) -> str:
    dist = _dist_name()
    dist_info = f"{dist}.dist-info"
    name = f"{dist}-py3-none-any.whl"
    writer = _WheelWriter(Path(wheel_directory) / name)
    if editable:
        writer.add(f"__editable__.{PACKAGE}.pth", f"{ROOT}\n".encode())
    else:
        for path in _package_files():
            writer.add(path.relative_to(ROOT).as_posix(), path.read_bytes())
        for path, arcname in _data_files():
            writer.add(arcname, path.read_bytes())
    writer.add(f"{dist_info}/METADATA", _metadata().encode())
    wheel_meta = (
        "Wheel-Version: 1.0\nGenerator: flashinfer build_backend\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n"
    )
    writer.add(f"{dist_info}/WHEEL", wheel_meta.encode())
    entry_points = _entry_points()
    if entry_points:
        writer.add(f"{dist_info}/entry_points.txt", entry_points.encode())
    writer.close(dist_info)
    return name


def _link_data_dirs() -> None:
    """flashinfer/data/<dir> -> ../../<dir> in the checkout (git-ignored)."""
    data = ROOT / PACKAGE / "data"
    data.mkdir(exist_ok=True)
    for name in DATA_DIRS:
        link = data / name
        if not (ROOT / name).is_dir():
            continue
        if link.is_symlink() or link.exists():
            if link.is_symlink() and os.readlink(link) == f"../../{name}":
                continue
            raise RuntimeError(f"{link} exists and is not the expected symlink; remove it")
        link.symlink_to(f"../../{name}", target_is_directory=True)


# -- PEP 517 / 660 hooks -----------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):  # noqa: ANN001, ANN201
    return []


def get_requires_for_build_editable(config_settings=None):  # noqa: ANN001, ANN201
    return []


def get_requires_for_build_sdist(config_settings=None):  # noqa: ANN001, ANN201
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):  # noqa: ANN001, ANN201
    return _write_wheel(wheel_directory, editable=False)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):  # noqa: ANN001, ANN201
    _link_data_dirs()
    return _write_wheel(wheel_directory, editable=True)


def build_sdist(sdist_directory, config_settings=None):  # noqa: ANN001, ANN201
    dist = _dist_name()
    name = f"{dist}.tar.gz"
    members = ["pyproject.toml", "build_backend.py", "README.md", "LICENSE"]
    paths = [ROOT / m for m in members if (ROOT / m).is_file()]
    paths += _package_files() + [p for p, _ in _data_files()]
    with tarfile.open(Path(sdist_directory) / name, "w:gz") as tar:
        for path in paths:
            tar.add(path, arcname=f"{dist}/{path.relative_to(ROOT).as_posix()}")
        pkg_info = _metadata().encode()
        info = tarfile.TarInfo(f"{dist}/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return name
