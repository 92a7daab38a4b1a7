#!/usr/bin/env bash
# Every notebook, 8 at a time, on this machine's GPU: what a workshop room does to one shared GPU.
#
#   tools/gpu/notebooks_parallel.sh                  # all of notebooks/, 8 at a time
#   tools/gpu/notebooks_parallel.sh -n 16            # 16 at a time
#   tools/gpu/notebooks_parallel.sh notebooks/12_backward_pass.ipynb notebooks/10_fast_kernel.ipynb
#
# Run from anywhere, in the course's environment (pytest, pytest-xdist and nbmake: `pip install -e .[test]`).
# It is the plain command below, so that no Makefile is needed:
#
#   python -m pytest --nbmake notebooks -n 8 -p no:cacheprovider
#
# Every notebook must pass: none asserts on a number it measures live (a timing, the device's measured copy
# bandwidth or matrix rate), which another process on the same GPU moves; their claims are checked on the
# recorded data. The log and a JUnit report (seconds per notebook) go to $OUT (default ./probe_out).
set -euo pipefail
cd "$(dirname "$0")/../.."
workers=8
if [[ "${1:-}" == "-n" ]]; then
    workers=$2
    shift 2
fi
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    targets=(notebooks)
fi
out=${OUT:-./probe_out}
mkdir -p "$out"
python -m pytest --nbmake "${targets[@]}" -n "$workers" -p no:cacheprovider -q \
    --junitxml="$out/notebooks_parallel.xml" 2>&1 | tee "$out/notebooks_parallel.log"
