#!/usr/bin/env bash
# The checks of .pre-commit-config.yaml, with the venv's pinned tools (see setup_env.sh):
# ruff, ruff format, clang-format on csrc/ and include/ (new files too, before their commit).
# Non-zero on any finding.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$ROOT"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
git ls-files -z --cached --others --exclude-standard \
  'csrc/*.h' 'csrc/*.cc' 'csrc/*.cu' 'include/*.h' 'include/*.cuh' \
  | xargs -0 "$VENV/bin/clang-format" --dry-run -Werror
echo "[lint] ruff, ruff format and clang-format: clean"
