"""A built module's manifest: every file that went into it, with stat and content hash,
and the library it produced.

The warm path reads the manifest and stats its files, with no subprocess and no lock.
The library's (size, mtime, inode) are checked the same way, so a truncated, rewritten
or replaced library is rebuilt instead of loaded; its sha256 is there for
``flashinfer cache verify``, which hashes on request.
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
_FORMAT = 2


@dataclass(frozen=True)
class FileRecord:
    size: int
    mtime_ns: int
    sha256: str

    @classmethod
    def of(cls, path: Path) -> FileRecord:
        st = path.stat()
        return cls(st.st_size, st.st_mtime_ns, sha256_file(path))

    @classmethod
    def parse(cls, raw: Any) -> FileRecord:
        size, mtime_ns, sha = raw
        if not (isinstance(size, int) and isinstance(mtime_ns, int) and isinstance(sha, str)):
            raise TypeError(f"bad file record {raw!r}")
        return cls(size, mtime_ns, sha)


@dataclass(frozen=True)
class LibraryRecord:
    """The published library as the build left it."""

    size: int
    mtime_ns: int
    inode: int
    sha256: str

    @classmethod
    def of(cls, path: Path) -> LibraryRecord:
        st = path.stat()
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, sha256_file(path))

    def check(self, path: Path) -> tuple[str | None, LibraryRecord]:
        """Why the file at ``path`` is not this library, or None; and the record to keep.

        Size decides at once (a truncated file is never hashed). Same size with another
        mtime or inode (a rewrite, or a copied workspace) is hashed: same bytes give a
        refreshed record, so the next check is a stat again.
        """
        try:
            st = os.stat(path)
        except OSError:
            return f"its library {path.name} is missing", self
        if st.st_size != self.size:
            return f"its library {path.name} changed size ({self.size} -> {st.st_size} bytes)", self
        if (st.st_mtime_ns, st.st_ino) == (self.mtime_ns, self.inode):
            return None, self
        if sha256_file(path) != self.sha256:
            return f"its library {path.name} was modified", self
        return None, LibraryRecord(st.st_size, st.st_mtime_ns, st.st_ino, self.sha256)


@dataclass
class Manifest:
    identity: dict[str, Any]
    library: str
    inputs: dict[str, FileRecord]
    objects: dict[str, list[str]] = field(default_factory=dict)
    library_record: LibraryRecord | None = None

    def save(self, build_dir: Path) -> None:
        lib = self.library_record
        data = {
            "format": _FORMAT,
            "identity": self.identity,
            "library": self.library,
            "library_record": None
            if lib is None
            else [lib.size, lib.mtime_ns, lib.inode, lib.sha256],
            "inputs": {p: [r.size, r.mtime_ns, r.sha256] for p, r in sorted(self.inputs.items())},
            "objects": self.objects,
        }
        atomic_write_text(build_dir / MANIFEST_NAME, json.dumps(data, indent=1))

    @classmethod
    def load(cls, build_dir: Path) -> Manifest | None:
        """The manifest in ``build_dir``; None when it is missing, from another format, or
        does not parse (wrong JSON types included): the module is then rebuilt."""
        try:
            data = json.loads((build_dir / MANIFEST_NAME).read_text())
            if not isinstance(data, dict) or data.get("format") != _FORMAT:
                return None
            identity, library, objects = data["identity"], data["library"], data["objects"]
            if not (
                isinstance(identity, dict)
                and isinstance(library, str)
                and isinstance(objects, dict)
                and all(isinstance(v, list) for v in objects.values())
            ):
                return None
            size, mtime_ns, inode, sha = data["library_record"]
            if not all(isinstance(v, int) for v in (size, mtime_ns, inode)) or not isinstance(
                sha, str
            ):
                return None
            return cls(
                identity=identity,
                library=library,
                inputs={str(p): FileRecord.parse(r) for p, r in data["inputs"].items()},
                objects=objects,
                library_record=LibraryRecord(size, mtime_ns, inode, sha),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
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
