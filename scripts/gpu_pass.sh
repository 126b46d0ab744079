#!/usr/bin/env bash
# One pass on a lent GPU machine, run through ../shared/gpu/device-run.sh. The modules it
# loads (scripts/gpu_modules.py's, for sm_90a) come from the layer scripts/gpu_prebuild.sh
# carried in .device/ when that was built from this tree; what of it does not load or serve
# here, or all of it when it was not, is compiled here first. Then the GPU tests, in the
# order given, one pytest run per path or per comma-joined group of paths (a CUDA error
# ends only its own run's tests), stopping bench_reserve_s before the budget; then each
# benchmark command (in benchmarks/) within the budget (a device command may run 10
# minutes; the budget counts from this script's start, after device-run.sh's set-up). The
# tables this pass wrote (benchmarks/results/*.md) and each step's log come back in
# $OUT/results.tgz, packed again after each step (one file: $OUT returns at most 8).
# Scratch (the layer, the workspace, the logs) goes under $GPU_PASS_TMP (/tmp). A group's
# tests run on GPU_PASS_WORKERS pytest-xdist processes (4), or on N for a group written
# N@paths (1@paths: one process, in order, as timing tests need). Exits with the first
# failing step's status.
# Usage: bash scripts/gpu_pass.sh "<test paths>" "<benchmark commands, ;-separated>" \
#          [budget_s] [bench_reserve_s]
set -uf  # -f: test paths and commands are not globbed
OUT=${OUT:-/tmp/out}
tmp=${GPU_PASS_TMP:-/tmp}
logs=$tmp/pass-logs
rm -rf "$logs"  # a warm machine's earlier pass must not come back as this one's
mkdir -p "$OUT" "$logs"
stamp=$logs/.start
touch "$stamp"
budget=${3:-560}
reserve=${4:-0}
export FLASHINFER_CUDA_ARCH_LIST=9.0a
export FLASHINFER_WORKSPACE_BASE=$tmp/fi-ws
export FLASHINFER_AOT_DIR=$tmp/aot
SECONDS=0
worst=0
note_rc() { [ "$1" -ne 0 ] && [ "$worst" -eq 0 ] && worst=$1; return 0; }
# Packed after every step, so a pass cut off by the device's limit still returns what ran;
# only the tables this pass wrote (a skipped benchmark's checked-in table is no result).
pack() {
  find benchmarks/results -name '*.md' -newer "$stamp" -exec cp {} "$logs/" \;
  tar czf "$OUT/.results.tgz" -C "$logs" --exclude=.start . && mv -f "$OUT/.results.tgz" "$OUT/results.tgz"
}
# The layer in $tmp/aot is kept from an earlier pass on this warm machine when the tree and
# the carried layer are the same as then; else it is replaced: by the carried one when that
# was built from this tree, else by nothing. gpu_modules.py then removes what does not load
# here and builds what the layer cannot serve (everything, when it is empty).
digest=$(bash scripts/kernel_digest.sh)
carried_sum=$(sha256sum .device/aot.tgz 2>/dev/null | cut -d' ' -f1)
key="$digest ${carried_sum:-none}"
if [ -z "$digest" ] || [ "$(cat "$tmp/aot.key" 2>/dev/null)" != "$key" ]; then
  rm -rf "$tmp/aot" "$tmp/aot.key"
  if [ -z "$digest" ]; then
    echo "=== the tree's digest could not be taken: compiling here"
  elif [ -z "$carried_sum" ]; then
    echo "=== no carried layer: compiling here"
  elif [ "$(cat .device/aot.digest 2>/dev/null)" != "$digest" ]; then
    echo "=== the carried layer was built from other sources: compiling here"
  elif ! tar xzf .device/aot.tgz -C "$tmp"; then
    echo "=== the carried layer does not unpack: compiling here"
    rm -rf "$tmp/aot"
  fi
  [ -n "$digest" ] && echo "$key" >"$tmp/aot.key"
fi
echo "=== modules (t=${SECONDS}s)"
# SIGINT: the build stops its compilers and publishes the modules that did build.
limit=$((budget - reserve - 120 - SECONDS))
[ "$limit" -lt 60 ] && limit=60
timeout -s INT -k 90 "$limit" python3 scripts/gpu_modules.py "$tmp/aot" >"$logs/modules.log" 2>&1
rc=$?
note_rc $rc
echo "modules rc=$rc in ${SECONDS}s"
tail -4 "$logs/modules.log"
pack
pytest_flags=()
python3 -c "import pytest_timeout" 2>/dev/null && pytest_flags+=(--timeout 90)
python3 -c "import xdist" 2>/dev/null && xdist=1 || xdist=0
for group in ${1:-}; do
  left=$((budget - reserve - SECONDS))
  if [ "$left" -lt 30 ]; then echo "=== skip $group (t=${SECONDS}s)"; continue; fi
  # Several processes share the GPU (most tests are bound by host work and their float64
  # references, none needs the whole card); "1@paths" runs a group alone, in order (timings).
  workers=${GPU_PASS_WORKERS:-4}
  if [[ $group =~ ^([0-9]+)@(.+)$ ]]; then
    workers=${BASH_REMATCH[1]} group=${BASH_REMATCH[2]}
  fi
  spread=()
  [ "$workers" -gt 1 ] && [ "$xdist" = 1 ] && spread=(-n "$workers" --dist load)
  echo "=== pytest $group on $workers worker(s) (t=${SECONDS}s)"
  log=$logs/pytest_$(echo "$group" | tr '/,' '_+').log
  IFS=',' read -ra paths <<<"$group"
  # -rs: a test that ran the GPU out of memory is skipped (conftest.py); its reason shows.
  timeout -k 10 $((left - 10)) python3 -m pytest -q -m gpu "${pytest_flags[@]}" "${spread[@]}" \
    -rfEs -p no:cacheprovider --show-capture=no --tb=short --durations=10 "${paths[@]}" \
    >"$log" 2>&1
  rc=$?
  note_rc $rc
  echo "rc=$rc (t=${SECONDS}s)"
  tail -60 "$log"
  pack
done
IFS=';' read -ra commands <<<"${2:-}"
for command in "${commands[@]}"; do
  [ -z "${command// /}" ] && continue
  left=$((budget - SECONDS))
  if [ "$left" -lt 40 ]; then echo "=== skip $command (t=${SECONDS}s)"; continue; fi
  echo "=== $command (t=${SECONDS}s)"
  (cd benchmarks && set -o pipefail && timeout -k 10 $((left - 15)) bash -c "$command" 2>&1 | tail -40)
  rc=$?
  note_rc $rc
  pack
done
echo "=== done in ${SECONDS}s (first failing rc: $worst); results and logs in $OUT/results.tgz"
exit "$worst"
