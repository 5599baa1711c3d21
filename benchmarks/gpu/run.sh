#!/usr/bin/env bash
# The GPU check in one command, on the machine with the GPU (no network needed): installs the
# carried wheels, builds llama-server, llama-bench and ggml-rpc-server with CUDA for sm_90 from the
# carried llama.cpp source, writes the calibrated models, and measures the app there (hw, the
# llama-server probe with every layer on the GPU, an adaptive sweep of the demo tasks, llama-bench
# tg128 against the sweep's baseline, RPC, the busy check with NVML, the break-even model at
# K=1..4). Each step has its own time limit; a failed step is reported and the next one runs.
# Report: gpu-check.json, gpu-check.md, results.jsonl, busy.jsonl, logs.txt under $OUT (else
# .gpu-work/out).
#
#   bash benchmarks/gpu/run.sh                       # there (after prepare.sh here)
#   bash benchmarks/gpu/run.sh --cpu                 # the same steps with a CPU build, anywhere
#   bash benchmarks/gpu/run.sh --cpu --prebuilt DIR  # with binaries already built (no build step)
#
# Options go to benchmarks/gpu/check.py (--help lists them). PYTHON: the interpreter the app runs
# under (default python3; its numpy, psutil, jinja2 and nvidia-ml-py are used as they are).
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
if ! command -v "$py" >/dev/null 2>&1; then
  echo "run.sh: no $py (set PYTHON)" >&2
  exit 2
fi
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "run.sh: $py is older than Python 3.10" >&2
  exit 2
fi
cd "$root" || exit 2
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4
fi
exec "$py" "$root/benchmarks/gpu/check.py" --python "$(command -v "$py")" "$@"
