"""Renders Jinja config templates from csrc/ into a module's generated-sources dir.

A render is a pure function of the template and the parameters, so its key (a hash of the
template's path, size and mtime, and the parameters) is stored beside the output: a process
that finds the key unchanged skips Jinja entirely (importing and compiling it costs ~25 ms)
without even reading the template. Any stat change re-renders; the output is rewritten
only when its text differs, so its mtime (and the modules built from it) stay put.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from . import env
from .fileutil import atomic_write_text, write_if_different


@functools.cache
def _environment():  # noqa: ANN202 - jinja2 is imported only when a render is needed
    import jinja2

    return jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )


def render_template(template: str | Path, module_uri: str, output_name: str, **params: Any) -> Path:
    """Render ``template`` (a path, or a file name in csrc/) with ``params`` into
    ``<workspace>/generated/<module_uri>/<output_name>``; an unchanged render keeps its mtime."""
    path = Path(template)
    if not path.is_absolute():
        path = env.FLASHINFER_CSRC_DIR / path
    st = path.stat()
    key = hashlib.sha256(
        json.dumps(
            [str(path), st.st_size, st.st_mtime_ns, params], sort_keys=True, default=str
        ).encode()
    ).hexdigest()
    out = env.generated_dir(module_uri) / output_name
    key_file = out.with_name(f".{output_name}.key")
    try:
        if out.is_file() and key_file.read_text() == key:
            return out
    except OSError:
        pass
    text = _environment().from_string(path.read_text()).render(**params)
    with env.writing_workspace(f"write the rendered {output_name} of {module_uri}"):
        write_if_different(out, text)
        atomic_write_text(key_file, key)
    return out
