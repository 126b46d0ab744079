"""The module repository: modules missing locally, downloaded instead of compiled.

A repository is what ``python -m flashinfer precompile --out DIR`` writes (an AOT layer)
plus its index, ``repository.json``: per module, what it was built for (as its ``aot.json``
records) and each file's size and sha256. It is served as-is over http(s) or read through
``file://`` (FLASHINFER_CUBINS_REPOSITORY). A module is downloaded into a private dir of the
download dir (``env.cubin_dir()``), checked against the index and its own record, and
published by renaming that dir, so the download dir is an AOT layer like any other: a
module there is used only when its record matches this process, and its library is
verified on load. A partial download never has a module's final name.

Every failure (the server, a timeout, a short body, a checksum, an index that lies) is one
warning naming the URL and the cause; the caller then compiles as it would without a
repository. Only stdlib ``urllib`` is used; each connect and each read has a timeout
(FLASHINFER_CUBIN_DOWNLOAD_TIMEOUT), so a stalled server cannot hang a process.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Sequence

from ..config import config
from ..version import __version__
from . import aot, env
from .aot import AOT_RECORD, AotRecord, Target
from .arch import CudaArch
from .fileutil import sha256_file
from .lock import module_lock, pid_alive
from .verify import library_problem

logger = logging.getLogger("flashinfer.jit")

REPOSITORY_INDEX = "repository.json"
INDEX_FORMAT = 1

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")  # a module or file name: no path parts
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_INDEX_BYTES = 64 << 20
_CHUNK = 1 << 20
_HOST = socket.gethostname()
_LEFTOVER = re.compile(r"\.(?P<uri>.+)\.(partial|old)-(?P<host>.+)-(?P<pid>\d+)-[^-]+")


# -- the index ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class IndexEntry:
    """One module of a repository: what it was built for and its files."""

    uri: str
    op: str
    flashinfer: str
    tvm_ffi: str
    archs: tuple[CudaArch, ...]
    settings: dict[str, Any]
    files: dict[str, FileEntry]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())

    @classmethod
    def of(cls, module_dir: Path, op: str) -> IndexEntry | None:
        """The entry of a published module dir, from its record; None without a record
        that names the dir's module."""
        record_path = module_dir / AOT_RECORD
        record = AotRecord.load(record_path)
        if record is None or record.uri != module_dir.name:
            return None
        return cls(
            uri=record.uri,
            op=op,
            flashinfer=record.flashinfer,
            tvm_ffi=record.tvm_ffi,
            archs=record.archs,
            settings=record.settings,
            files={
                AOT_RECORD: FileEntry(record_path.stat().st_size, sha256_file(record_path)),
                f"{record.uri}.so": FileEntry(record.library_size, record.library_sha256),
            },
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "flashinfer": self.flashinfer,
            "tvm_ffi": self.tvm_ffi,
            "archs": [str(a) for a in self.archs],
            "settings": self.settings,
            "files": {n: {"size": f.size, "sha256": f.sha256} for n, f in self.files.items()},
        }

    @classmethod
    def parse(cls, uri: str, raw: Any) -> IndexEntry:
        """Raises ValueError saying what is wrong: an index must not name paths outside a
        module's dir, nor leave out a module's record or library."""
        if not _NAME.fullmatch(uri):
            raise ValueError(f"bad module name {uri!r}")
        if not isinstance(raw, dict) or not isinstance(raw.get("files"), dict):
            raise ValueError(f"{uri}: no files")
        files = {}
        for name, item in raw["files"].items():
            size = item.get("size") if isinstance(item, dict) else None
            sha = item.get("sha256") if isinstance(item, dict) else None
            if not _NAME.fullmatch(name):
                raise ValueError(f"{uri}: bad file name {name!r}")
            if type(size) is not int or size < 0 or not isinstance(sha, str):
                raise ValueError(f"{uri}: bad size or sha256 of {name}")
            if not _SHA256.fullmatch(sha):
                raise ValueError(f"{uri}: bad sha256 of {name}")
            files[name] = FileEntry(size, sha)
        missing = sorted({AOT_RECORD, f"{uri}.so"} - set(files))
        if missing:
            raise ValueError(f"{uri}: lists no {' and no '.join(missing)}")
        fields = {key: raw.get(key) for key in ("op", "flashinfer", "tvm_ffi")}
        bad = [key for key, value in fields.items() if not isinstance(value, str)]
        if (
            bad
            or not isinstance(raw.get("archs"), list)
            or not isinstance(raw.get("settings"), dict)
        ):
            raise ValueError(f"{uri}: missing or malformed {', '.join(bad) or 'archs or settings'}")
        return cls(
            uri=uri,
            archs=tuple(CudaArch.parse(str(a), f"the index entry of {uri}") for a in raw["archs"]),
            settings=dict(raw["settings"]),
            files=files,
            **fields,
        )


@dataclass(frozen=True)
class RepositoryIndex:
    modules: dict[str, IndexEntry]

    def to_json(self) -> str:
        modules = {uri: self.modules[uri].to_dict() for uri in sorted(self.modules)}
        return json.dumps({"format": INDEX_FORMAT, "modules": modules}, indent=1)

    @classmethod
    def parse(cls, text: str | bytes) -> RepositoryIndex:
        """Raises ValueError saying what is wrong."""
        try:
            data = json.loads(text)
        except ValueError as err:
            raise ValueError(f"not JSON ({err})") from None
        found = data.get("format") if isinstance(data, dict) else None
        if found != INDEX_FORMAT:
            raise ValueError(f"format {found!r}; this flashinfer reads format {INDEX_FORMAT}")
        if not isinstance(data.get("modules"), dict):
            raise ValueError("no modules")
        return cls({uri: IndexEntry.parse(uri, raw) for uri, raw in data["modules"].items()})

    @classmethod
    def load(cls, path: Path) -> RepositoryIndex | None:
        try:
            return cls.parse(path.read_bytes())
        except (OSError, ValueError):
            return None


# -- transfers ----------------------------------------------------------------------------


class DownloadError(Exception):
    """A failed request or check of one URL: what the warning says."""

    def __init__(self, url: str, cause: str) -> None:
        super().__init__(f"{url}: {cause}")
        self.url = url
        self.cause = cause


def file_url(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(urllib.parse.quote(p) for p in parts)])


def _cause(err: BaseException) -> str:
    reason = err.reason if isinstance(err, urllib.error.URLError) else err
    if isinstance(reason, TimeoutError):
        timeout = config.cubin_download_timeout
        return f"no answer within {timeout:g} s (FLASHINFER_CUBIN_DOWNLOAD_TIMEOUT)"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__


def _get(url: str, write: Callable[[bytes], object], limit: int, too_long: str) -> tuple[int, str]:
    """Stream ``url`` into ``write``; its size and sha256. A body shorter than its
    Content-Length (a connection cut) or longer than ``limit`` is an error."""
    request = urllib.request.Request(url, headers={"User-Agent": f"flashinfer/{__version__}"})
    try:
        response = urllib.request.urlopen(request, timeout=config.cubin_download_timeout)
    except urllib.error.HTTPError as err:
        err.close()
        raise DownloadError(url, f"HTTP {err.code} {err.reason}") from None
    except (OSError, http.client.HTTPException, ValueError) as err:
        raise DownloadError(url, _cause(err)) from None
    digest = hashlib.sha256()
    size = 0
    with response:
        length = response.headers.get("Content-Length")
        while True:
            try:
                chunk = response.read1(_CHUNK)  # what has arrived: a stall shows
            except (OSError, http.client.HTTPException) as err:
                raise DownloadError(url, f"{_cause(err)} after {size} bytes") from None
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise DownloadError(url, too_long)
            digest.update(chunk)
            write(chunk)
    if length is not None and length.strip().isdigit() and size != int(length):
        raise DownloadError(url, f"truncated body: {size} of {int(length)} bytes")
    return size, digest.hexdigest()


def read_index(base: str) -> RepositoryIndex:
    """Fetch and parse the index of the repository at ``base`` (raises DownloadError)."""
    url = file_url(base, REPOSITORY_INDEX)
    chunks: list[bytes] = []
    _get(url, chunks.append, _MAX_INDEX_BYTES, "over 64 MiB: not a repository index")
    try:
        return RepositoryIndex.parse(b"".join(chunks))
    except ValueError as err:
        raise DownloadError(url, f"not a repository index: {err}") from None


def _download_file(url: str, out: BinaryIO, expected: FileEntry | None) -> tuple[int, str]:
    limit = sys.maxsize if expected is None else expected.size
    size, sha = _get(url, out.write, limit, f"longer than the {limit} bytes the index gives")
    if expected is not None:
        if size != expected.size:
            raise DownloadError(url, f"{size} bytes, the index gives {expected.size}")
        if sha != expected.sha256:
            raise DownloadError(
                url, f"checksum mismatch: sha256 {sha}, the index gives {expected.sha256}"
            )
    return size, sha


# -- the download dir ----------------------------------------------------------------------

_lock = threading.Lock()
_indexes: dict[str, RepositoryIndex] = {}
_notes: dict[str, str] = {}  # module -> why the repository did not provide it
_unchecked_warned = False


def repository_index(base: str) -> RepositoryIndex:
    """The index of ``base``, fetched once per process (again after a failure)."""
    with _lock:
        index = _indexes.get(base)
        if index is None:
            index = _indexes[base] = read_index(base)
        return index


def _warn_unchecked(base: str) -> None:
    global _unchecked_warned
    with _lock:
        if _unchecked_warned:
            return
        _unchecked_warned = True
    logger.warning(
        "FLASHINFER_CUBIN_CHECKSUM_DISABLED=1: downloads from %s are not checked against the "
        "sizes and sha256 of its index (a library is still checked against its aot.json "
        "record before it is loaded)",
        base,
    )


def is_present(entry: IndexEntry) -> bool:
    """Whether the download dir holds ``entry``'s files (sizes and sha256 as the index gives,
    unless FLASHINFER_CUBIN_CHECKSUM_DISABLED; then present is enough)."""
    module_dir = env.cubin_dir() / entry.uri
    for name, expected in entry.files.items():
        path = module_dir / name
        if config.cubin_checksum_disabled:
            if not path.is_file():
                return False
        elif library_problem(path, expected.size, expected.sha256) is not None:
            return False
    return True


def _private_dir(layer: Path, uri: str, kind: str) -> Path:
    """A new ``.<uri>.<kind>-<host>-<pid>-<random>`` dir: never a module's name."""
    return Path(tempfile.mkdtemp(prefix=f".{uri}.{kind}-{_HOST}-{os.getpid()}-", dir=layer))


def _remove_leftovers(layer: Path, uri: str) -> None:
    """Remove the private dirs of ``uri`` left by processes of this host that died."""
    for path in layer.glob(f".{uri}.*-*"):
        owner = _LEFTOVER.fullmatch(path.name)
        if (
            owner
            and (owner["uri"], owner["host"]) == (uri, _HOST)
            and not pid_alive(int(owner["pid"]))
        ):
            shutil.rmtree(path, ignore_errors=True)


def _check_record(base: str, entry: IndexEntry, module_dir: Path, got: dict[str, Any]) -> None:
    """The downloaded record must name the module, describe the downloaded library and agree
    with the index on what the module was built for (else the index lies)."""
    url = file_url(base, entry.uri, AOT_RECORD)
    record = AotRecord.load(module_dir / AOT_RECORD)
    if record is None:
        raise DownloadError(url, "not a module record (malformed, or of another format)")
    if record.uri != entry.uri:
        raise DownloadError(url, f"the record of {record.uri!r}, not of {entry.uri!r}")
    if (record.library_size, record.library_sha256) != got[f"{entry.uri}.so"]:
        raise DownloadError(url, f"records another library than the {entry.uri}.so downloaded")
    differ = [
        f
        for f in ("flashinfer", "tvm_ffi", "archs", "settings")
        if getattr(record, f) != getattr(entry, f)
    ]
    if differ:
        raise DownloadError(url, f"the index gives another {', '.join(differ)} than this record")


def _publish(fresh: Path, target: Path) -> None:
    """Rename the complete ``fresh`` dir to ``target``, replacing an older one (a process
    that has its library mapped keeps the inode)."""
    os.chmod(fresh, 0o755)
    old = None
    if target.exists():
        old = _private_dir(target.parent, target.name, "old")
        os.replace(target, old / target.name)
    try:
        os.replace(fresh, target)
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        logger.debug("%s was published by another process meanwhile", target)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _download(base: str, entry: IndexEntry, layer: Path) -> None:
    checked = not config.cubin_checksum_disabled
    if not checked:
        _warn_unchecked(base)
    layer.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(layer, entry.uri)
    partial = _private_dir(layer, entry.uri, "partial")
    try:
        got = {}
        for name, expected in entry.files.items():
            with open(partial / name, "wb") as out:
                url = file_url(base, entry.uri, name)
                got[name] = _download_file(url, out, expected if checked else None)
        _check_record(base, entry, partial, got)
        _publish(partial, layer / entry.uri)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    logger.info("downloaded %s (%.1f MB) from %s", entry.uri, entry.size / 1e6, base)


def _skip(uri: str, note: str) -> bool:
    _notes[uri] = note
    logger.debug("not downloading %s: %s", uri, note)
    return False


def fetch(uri: str, target: Target | None = None) -> bool:
    """Bring ``uri`` from the repository into the download dir, under the module's lock (a
    process that waited finds it published). True when its checked files are there; False
    when there is no repository, downloads are off, the index does not list the module or
    lists a build for another target (``target``, default this process's), or a step failed
    (one warning naming the URL and the cause)."""
    base = config.cubins_repository
    if base is None:
        return False
    if config.no_download:
        return _skip(uri, f"FLASHINFER_NO_DOWNLOAD=1 forbids downloading it from {base}")
    try:
        entry = repository_index(base).modules.get(uri)
        if entry is None:
            return _skip(uri, f"the module repository {base} does not list it")
        problem = (target or Target.current()).mismatch(entry)
        if problem is not None:
            return _skip(
                uri,
                f"the module repository {base} has it built for another target (other {problem})",
            )
        with module_lock(uri):
            if not is_present(entry):
                _download(base, entry, env.cubin_dir())
    except DownloadError as err:
        _notes[uri] = f"downloading it failed: {err}"
        logger.warning("not downloading %s: %s: %s", uri, err.url, err.cause)
        return False
    except OSError as err:
        cause = f"{err.filename}: {err.strerror}" if err.filename else str(err)
        _notes[uri] = f"storing its download failed: {cause}"
        logger.warning("not downloading %s from %s: cannot store it: %s", uri, base, cause)
        return False
    _notes.pop(uri, None)
    return True


def fetch_library(uri: str) -> Path | None:
    """The library of ``uri`` from the repository, downloaded if needed, when it serves this
    process (``aot.find`` decides, as for any layer); else None."""
    return aot.find(uri) if fetch(uri) else None


def failure_note(uri: str) -> str:
    """Why the repository did not provide ``uri`` in this process, to append to an error."""
    note = _notes.get(uri)
    return f"; {note}" if note else ""


def download_all(
    entries: Sequence[IndexEntry],
    target: Target,
    on_done: Callable[[IndexEntry, bool], None] | None = None,
) -> dict[str, bool]:
    """fetch() every entry's module, FLASHINFER_CUBIN_DOWNLOAD_THREADS at a time."""
    results = {}
    with ThreadPoolExecutor(config.cubin_download_threads) as pool:
        futures = {pool.submit(fetch, entry.uri, target): entry for entry in entries}
        for future in as_completed(futures):
            entry = futures[future]
            results[entry.uri] = future.result()
            if on_done is not None:
                on_done(entry, results[entry.uri])
    return results


def clear() -> list[str]:
    """Remove every downloaded module and leftover private dir from the download dir, and the
    dir itself when nothing else is in it; the modules removed."""
    layer = env.cubin_dir()
    if not layer.is_dir():
        return []
    removed = []
    for path in sorted(layer.iterdir()):
        if _LEFTOVER.fullmatch(path.name):
            shutil.rmtree(path, ignore_errors=True)
        elif (path / AOT_RECORD).is_file():
            shutil.rmtree(path)
            removed.append(path.name)
    try:
        layer.rmdir()
    except OSError:
        pass  # holds files that are not ours
    return removed
