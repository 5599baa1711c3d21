#!/usr/bin/env bash
# Linux: build the frozen app from the spec, smoke-test it, pack it as a .tar.gz.
#   bash packaging/build_linux.sh            (uses ./.venv, made if missing)
# Output: packaging/dist/mtp-tuner/ (double-click mtp-tuner) and packaging/dist/mtp-tuner-<version>-linux-x64.tar.gz
# (the name from packaging/archive_name.py; the release workflow uploads it)
set -euo pipefail
cd "$(dirname "$0")/.."
source packaging/_prepare.sh
start=$(date +%s)
"$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
  --distpath packaging/dist --workpath packaging/build/pyinstaller packaging/mtp_tuner.spec
built=$(date +%s)
echo "build: $((built - start)) s; size: $(du -sh packaging/dist/mtp-tuner | cut -f1)"
"$PY" packaging/smoke_test.py packaging/dist/mtp-tuner/mtp-tuner
ARCHIVE="packaging/dist/$("$PY" packaging/archive_name.py)"
rm -f "$ARCHIVE"
tar -C packaging/dist -czf "$ARCHIVE" mtp-tuner
echo "archive: $ARCHIVE ($(du -sh "$ARCHIVE" | cut -f1))"
