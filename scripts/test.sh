#!/usr/bin/env bash
# Set up .venv (see setup_env.sh), then run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q -ra "$@"
