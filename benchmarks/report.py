"""Writes a benchmark's results as a markdown file (and prints it)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Sequence


def cpu_description() -> str:
    """``<CPU model>, <N> cores`` of this machine."""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "unknown CPU"
    return f"{model}, {os.cpu_count()} cores"


def write_report(
    path: Path,
    title: str,
    facts: Sequence[str],
    header: Sequence[str],
    aligns: str,
    rows: Sequence[Sequence[str]],
    echo: bool = True,
) -> str:
    """``facts`` become a bullet list; ``aligns`` has one character per column: l or r.
    ``echo``: print it too."""
    rule = ["---:" if a == "r" else "---" for a in aligns]
    lines = [
        f"# {title}",
        "",
        *(f"- {fact}" for fact in facts),
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(rule) + " |",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    text = "\n".join(lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")  # a run killed mid-write keeps the last
    partial.write_text(text)
    partial.replace(path)
    if echo:
        print(text)
    return text
