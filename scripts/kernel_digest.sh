#!/usr/bin/env bash
# Print one digest of everything a module build reads from the project (kernel and binding
# sources, templates, the JIT package that renders and flags them, the debug printer's test
# module), so that a layer built on one machine can be checked against the tree on another
# without git. Run from the root.
set -euo pipefail
find include csrc flashinfer/jit tests/debug/debug_module -type f \
  \( -name '*.cuh' -o -name '*.h' -o -name '*.cu' -o -name '*.cc' -o -name '*.jinja' -o -name '*.py' \) \
  -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
