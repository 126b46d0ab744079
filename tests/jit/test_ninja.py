"""The build.ninja writer: rules, depfiles, atomic link, escaping (no compiler needed)."""

from __future__ import annotations

from pathlib import Path

from flashinfer.jit.ninja import NinjaBuild


def _build(**overrides) -> NinjaBuild:
    fields = dict(
        sources=(Path("/src/a_kernel.cu"), Path("/src/a.cc"), Path("/other/a.cc")),
        output="mod.so",
        nvcc=("ccache", "/cuda/bin/nvcc"),
        cxx=("/usr/bin/c++",),
        cuda_cflags=("-O3", "-DX=$(y)"),
        cflags=("-O2", "-DMSG=a b"),
        ldflags=("-shared", "-lcudart"),
    )
    fields.update(overrides)
    return NinjaBuild(**fields)


def test_rules_depfiles_and_link() -> None:
    text = _build().render()
    assert "nvcc = ccache /cuda/bin/nvcc" in text
    assert "build a_kernel.0.cuda.o: compile_cuda /src/a_kernel.cu" in text
    assert "build a.1.host.o: compile_cxx /src/a.cc" in text
    # Same-named sources get distinct objects.
    assert "build a.2.host.o: compile_cxx /other/a.cc" in text
    assert text.count("deps = gcc") == 2
    assert "--generate-nonsystem-dependencies-with-compile" in text
    assert "-MMD -MF $out.d" in text
    # The link writes a temp file and renames it: a killed link leaves no partial .so.
    assert "-o ${out}.tmp && mv -f ${out}.tmp $out" in text
    assert "build mod.so: link a_kernel.0.cuda.o a.1.host.o a.2.host.o" in text
    assert "default mod.so" in text


def test_flags_are_quoted_and_dollars_escaped() -> None:
    text = _build().render()
    assert "cflags = -O2 '-DMSG=a b'" in text
    assert "'-DX=$$(y)'" in text


def test_paths_with_spaces_and_colons_are_escaped() -> None:
    text = _build(sources=(Path("/my src/c:d.cu"),)).render()
    assert "compile_cuda /my$ src/c$:d.cu" in text
