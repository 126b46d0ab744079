"""Renders Jinja config templates from csrc/ into a module's generated-sources dir.

A render is a pure function of the template and the parameters, so its key (a hash of the
template's path, size and mtime, and the parameters) is stored beside the output: a process
that finds the key unchanged skips Jinja entirely (importing and compiling it costs ~25 ms)
without even reading the template. Any stat change re-renders; the output is rewritten
only when its text differs, so its mtime (and the modules built from it) stay put.

Specs hold :class:`PendingRender` records and render only when planned: the warm path
(plan_index.py) identifies a render by its key and never touches the output.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
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


@dataclass(frozen=True)
class PendingRender:
    """A template to render into ``<workspace>/generated/<module_uri>/<output_name>``."""

    template: Path
    module_uri: str
    output_name: str
    params: dict[str, Any]

    @classmethod
    def of(
        cls, template: str | Path, module_uri: str, output_name: str, **params: Any
    ) -> PendingRender:
        """``template``: a path, or a file name in csrc/."""
        return cls(Path(env.FLASHINFER_CSRC_DIR, template), module_uri, output_name, params)

    @property
    def output(self) -> Path:
        return env.generated_dir(self.module_uri) / self.output_name

    def fingerprint(self) -> list[Any]:
        """What the render is a function of: the template's path and stat, the parameters."""
        st = os.stat(self.template)
        return [str(self.template), st.st_size, st.st_mtime_ns, self.params]

    def key(self) -> str:
        """A hash of the fingerprint: changes whenever the render could."""
        text = json.dumps(self.fingerprint(), sort_keys=True, default=str)
        return hashlib.blake2b(text.encode(), digest_size=32).hexdigest()

    def render(self) -> Path:
        """Bring the output up to date (an unchanged render keeps its mtime); return it."""
        key = self.key()
        out = self.output
        key_file = out.with_name(f".{self.output_name}.key")
        try:
            if out.is_file() and key_file.read_text() == key:
                return out
        except OSError:
            pass
        text = _environment().from_string(self.template.read_text()).render(**self.params)
        with env.writing_workspace(f"write the rendered {self.output_name} of {self.module_uri}"):
            write_if_different(out, text)
            atomic_write_text(key_file, key)
        return out


def render_template(template: str | Path, module_uri: str, output_name: str, **params: Any) -> Path:
    """Render ``template`` (a path, or a file name in csrc/) with ``params`` into
    ``<workspace>/generated/<module_uri>/<output_name>`` now; an unchanged render keeps its
    mtime."""
    return PendingRender.of(template, module_uri, output_name, **params).render()
