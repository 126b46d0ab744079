"""A built module's manifest: every file that went into it, with stat and content hash.

The warm path reads the manifest and stats its files, with no subprocess and no lock.
A file whose (size, mtime) changed is re-hashed, and only a content change makes the
module stale, so neither ``touch`` nor a reinstall that rewrites files with old mtimes
fools it. Objects that depend on a changed file are named so the builder can delete
them, which forces ninja to rebuild them even when the new file has an older mtime.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fileutil import atomic_write_text, sha256_file

MANIFEST_NAME = "manifest.json"
_FORMAT = 1


@dataclass(frozen=True)
class FileRecord:
    size: int
    mtime_ns: int
    sha256: str

    @classmethod
    def of(cls, path: Path) -> FileRecord:
        st = path.stat()
        return cls(st.st_size, st.st_mtime_ns, sha256_file(path))


@dataclass
class Manifest:
    identity: dict[str, Any]
    library: str
    inputs: dict[str, FileRecord]
    objects: dict[str, list[str]] = field(default_factory=dict)

    def save(self, build_dir: Path) -> None:
        data = {
            "format": _FORMAT,
            "identity": self.identity,
            "library": self.library,
            "inputs": {p: [r.size, r.mtime_ns, r.sha256] for p, r in sorted(self.inputs.items())},
            "objects": self.objects,
        }
        atomic_write_text(build_dir / MANIFEST_NAME, json.dumps(data, indent=1))

    @classmethod
    def load(cls, build_dir: Path) -> Manifest | None:
        try:
            data = json.loads((build_dir / MANIFEST_NAME).read_text())
            if data.get("format") != _FORMAT:
                return None
            return cls(
                identity=data["identity"],
                library=data["library"],
                inputs={p: FileRecord(*r) for p, r in data["inputs"].items()},
                objects=data["objects"],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def changed_inputs(self) -> tuple[list[str], bool]:
        """Inputs whose content differs from the record (missing files count), and
        whether any stat differed for unchanged content (the record can be refreshed)."""
        changed: list[str] = []
        restat = False
        for path, record in self.inputs.items():
            try:
                st = os.stat(path)
            except OSError:
                changed.append(path)
                continue
            if st.st_size == record.size and st.st_mtime_ns == record.mtime_ns:
                continue
            if st.st_size == record.size and sha256_file(Path(path)) == record.sha256:
                self.inputs[path] = FileRecord(st.st_size, st.st_mtime_ns, record.sha256)
                restat = True
                continue
            changed.append(path)
        return changed, restat

    def objects_depending_on(self, paths: list[str]) -> list[str]:
        wanted = set(paths)
        return [obj for obj, deps in self.objects.items() if wanted.intersection(deps)]


def read_ninja_deps(ninja: Path, build_dir: Path) -> dict[str, list[str]]:
    """Each object's dependencies (absolute paths) from ninja's deps log."""
    proc = subprocess.run(
        [str(ninja), "-C", str(build_dir), "-t", "deps"],
        capture_output=True,
        text=True,
        check=True,
    )
    deps: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in proc.stdout.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            target = line.split(":", 1)[0]
            current = deps.setdefault(target, [])
        elif current is not None:
            current.append(os.path.normpath(build_dir / line.strip()))
    return deps
