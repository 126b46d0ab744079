#!/usr/bin/env bash
# Set up .venv (see setup_env.sh), then run the demo: JIT-compile RMSNorm, show the caches.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" scripts/quickstart_demo.py "$@"
