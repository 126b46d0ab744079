#!/usr/bin/env bash
# On the CPU machine, before a GPU pass: build the modules it loads (scripts/gpu_modules.py)
# into .device/aot.tgz, with the kernel digest of this tree beside it (.device/aot.digest).
# gpu_pass.sh starts from the layer when the digest matches the tree it runs on, and then
# compiles only what of it does not load or serve there; otherwise it compiles everything on
# the GPU machine. 6 to 9 minutes on 2 cores.
# Usage: bash scripts/gpu_prebuild.sh   (then carry .device as ../shared/gpu/README.md says)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
python=${PYTHON:-.venv/bin/python}
[ -d .device ] || { echo "run bash ../shared/gpu/prepare.sh first" >&2; exit 1; }
digest=$(bash scripts/kernel_digest.sh)  # of what the build reads, taken before it
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
FLASHINFER_WORKSPACE_BASE="$stage/ws" "$python" scripts/gpu_modules.py "$stage/aot"
tar czf .device/aot.tgz -C "$stage" aot
echo "$digest" >.device/aot.digest
echo "wrote .device/aot.tgz ($(du -h .device/aot.tgz | cut -f1)), digest $(cat .device/aot.digest)"
