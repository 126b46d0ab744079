#!/usr/bin/env bash
# One pass on a lent GPU machine, run through ../shared/gpu/device-run.sh. The modules it
# loads (scripts/gpu_modules.py's, for sm_90a) come from the layer scripts/gpu_prebuild.sh
# carried in .device/ when that matches this tree and loads here, else they are compiled
# here first. Then the GPU tests, in the order given, one pytest run per path or per
# comma-joined group of paths (a CUDA error ends only its own run's tests), stopping
# bench_reserve_s before the budget; then each benchmark command (in benchmarks/) within the
# budget (a device command may run 10 minutes). The results tables (benchmarks/results/*.md)
# and each test process's log come back in $OUT/results.tgz (one file: $OUT returns at
# most 8). Scratch (the layer, the workspace, the logs) goes under $GPU_PASS_TMP (/tmp).
# A group's tests run on GPU_PASS_WORKERS pytest-xdist processes (4), or on N for a group
# written N@paths (1@paths: one process, in order, as timing tests need).
# Usage: bash scripts/gpu_pass.sh "<test paths>" "<benchmark commands, ;-separated>" \
#          [budget_s] [bench_reserve_s]
set -u
OUT=${OUT:-/tmp/out}
tmp=${GPU_PASS_TMP:-/tmp}
logs=$tmp/pass-logs
mkdir -p "$OUT" "$logs"
budget=${3:-560}
reserve=${4:-0}
export FLASHINFER_CUDA_ARCH_LIST=9.0a
export FLASHINFER_WORKSPACE_BASE=$tmp/fi-ws
export FLASHINFER_AOT_DIR=$tmp/aot
SECONDS=0
carried=0
if [ -f .device/aot.tgz ]; then
  if [ "$(cat .device/aot.digest 2>/dev/null)" != "$(bash scripts/kernel_digest.sh)" ]; then
    echo "=== the carried layer was built from other sources: compiling here"
  elif tar xzf .device/aot.tgz -C "$tmp" && python3 - "$tmp/aot" <<'PY'; then
import glob
import sys
from pathlib import Path

import torch  # noqa: F401 - loads the CUDA runtime the libraries link
import tvm_ffi

from flashinfer.jit import aot

libraries = sorted(glob.glob(f"{sys.argv[1]}/*/*.so"))
for library in libraries:
    tvm_ffi.load_module(library)
print(f"=== the carried layer loads: {len(libraries)} modules")
refused = [Path(p).parent.name for p in libraries if aot.find(Path(p).parent.name) is None]
if refused:  # their records do not match this process: each compiles when a test needs it
    print(f"=== {len(refused)} of them are not taken here: {' '.join(refused[:5])}")
PY
    carried=1
  else
    echo "=== the carried layer does not load here: compiling here"
    rm -rf "$tmp/aot"
  fi
fi
if [ "$carried" = 0 ]; then
  echo "=== compile (t=${SECONDS}s)"
  timeout 300 python3 scripts/gpu_modules.py "$tmp/aot" >"$logs/compile.log" 2>&1
  echo "compile rc=$? in ${SECONDS}s"
  tail -3 "$logs/compile.log"
fi
pytest_flags=()
python3 -c "import pytest_timeout" 2>/dev/null && pytest_flags+=(--timeout 90)
python3 -c "import xdist" 2>/dev/null && xdist=1 || xdist=0
for group in $1; do
  left=$((budget - reserve - SECONDS))
  if [ "$left" -lt 30 ]; then echo "=== skip $group (t=${SECONDS}s)"; continue; fi
  # Several processes share the GPU (most tests are bound by host work and their float64
  # references, none needs the whole card); "1@paths" runs a group alone, in order (timings).
  workers=${GPU_PASS_WORKERS:-4}
  case $group in *@*) workers=${group%%@*} group=${group#*@} ;; esac
  spread=()
  [ "$workers" -gt 1 ] && [ "$xdist" = 1 ] && spread=(-n "$workers" --dist load)
  echo "=== pytest $group on $workers worker(s) (t=${SECONDS}s)"
  log=$logs/pytest_$(echo "$group" | tr '/,' '_+').log
  IFS=',' read -ra paths <<<"$group"
  timeout $((left - 10)) python3 -m pytest -q -m gpu "${pytest_flags[@]}" "${spread[@]}" -rfE \
    -p no:cacheprovider --show-capture=no --tb=short --durations=10 "${paths[@]}" >"$log" 2>&1
  echo "rc=$? (t=${SECONDS}s)"
  tail -60 "$log"
done
IFS=';' read -ra commands <<<"${2:-}"
for command in "${commands[@]}"; do
  [ -z "${command// /}" ] && continue
  left=$((budget - SECONDS))
  if [ "$left" -lt 40 ]; then echo "=== skip $command (t=${SECONDS}s)"; continue; fi
  echo "=== $command (t=${SECONDS}s)"
  (cd benchmarks && timeout $((left - 15)) bash -c "$command" 2>&1 | tail -40)
done
cp benchmarks/results/*.md "$logs/"
tar czf "$OUT/results.tgz" -C "$logs" .
echo "=== done in ${SECONDS}s; results and logs in $OUT/results.tgz"
