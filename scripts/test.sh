#!/usr/bin/env bash
# Set up .venv (see setup_env.sh), then run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$ROOT"
# One worker per core, each test file on one worker (an emulated module builds once per
# process); the workers share the session's JIT workspace (conftest.py), so an nvcc module
# builds once, under the workspace's lock.
exec "$VENV/bin/python" -m pytest -q -ra -n "$(nproc)" --dist loadfile "$@"
