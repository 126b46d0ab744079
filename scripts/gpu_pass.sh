#!/usr/bin/env bash
# One pass on a lent GPU machine, run through ../shared/gpu/device-run.sh: precompile every
# module for sm_90a in parallel (and every bfloat16 prefill tiling, which the tiling tests and
# bench_prefill --tilings build), run the GPU tests of each path given, then each benchmark
# command (in benchmarks/), within a time budget (a device command may run 10 minutes). The
# results tables (benchmarks/results/*.md) and the module cache (the AOT layer and the JIT
# workspace, both under /tmp) come back in $OUT; a later pass that carries .device/cache.tgz
# skips the builds.
# Usage: bash scripts/gpu_pass.sh "<test paths>" "<benchmark commands, ;-separated>" [budget_s]
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
budget=${3:-560}
export FLASHINFER_CUDA_ARCH_LIST=9.0a
export FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws
SECONDS=0
if [ -f .device/cache.tgz ]; then tar xzf .device/cache.tgz -C /tmp && echo "restored the module cache"; fi
echo "=== precompile"
timeout 220 python3 -m flashinfer precompile --arch 9.0a --out /tmp/aot >/tmp/precompile.out 2>&1
echo "precompile rc=$? in ${SECONDS}s"
tail -5 /tmp/precompile.out
export FLASHINFER_AOT_DIR=/tmp/aot
echo "=== prefill tilings (t=${SECONDS}s)"
timeout 200 python3 - <<'PY' 2>&1 | grep -v "^\[flashinfer\]" | tail -5
from concurrent.futures import ThreadPoolExecutor

from flashinfer.jit.prefill import HEAD_DIM_PAIRS, accepted_tilings, gen_prefill_module

specs = [
    gen_prefill_module("bfloat16", d, t, head_dim_vo=vo)
    for d, vo in HEAD_DIM_PAIRS
    for t in accepted_tilings(d, False, vo)
]
with ThreadPoolExecutor(8) as pool:
    list(pool.map(lambda spec: spec.build(), specs))
print(f"{len(specs)} tiling modules built")
PY
timeout_flag=()
python3 -c "import pytest_timeout" 2>/dev/null && timeout_flag=(--timeout 90)
for path in $1; do
  left=$((budget - SECONDS))
  if [ "$left" -lt 30 ]; then echo "=== skip $path (t=${SECONDS}s)"; continue; fi
  echo "=== pytest $path (t=${SECONDS}s)"
  timeout $((left - 10)) python3 -m pytest -q -m gpu "${timeout_flag[@]}" -rfE -p no:cacheprovider \
    --show-capture=no --tb=short "$path" 2>&1 | tail -80
done
tar czf "$OUT/cache.tgz" -C /tmp aot fi-ws 2>/dev/null
IFS=';' read -ra commands <<<"${2:-}"
for command in "${commands[@]}"; do
  [ -z "${command// /}" ] && continue
  left=$((budget - SECONDS))
  if [ "$left" -lt 40 ]; then echo "=== skip $command (t=${SECONDS}s)"; continue; fi
  echo "=== $command (t=${SECONDS}s)"
  (cd benchmarks && timeout $((left - 15)) bash -c "$command" 2>&1 | tail -40)
done
mkdir -p "$OUT/results" && cp benchmarks/results/*.md "$OUT/results/"
echo "=== done in ${SECONDS}s; results in $OUT/results"
