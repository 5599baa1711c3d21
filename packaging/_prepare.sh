# Sourced by build_linux.sh and build_macos.sh: the venv (made if missing), PyInstaller and Pillow,
# and the icons generated from resources/icons/mtp-tuner.png. Sets PY.
PY=${PYTHON:-.venv/bin/python}
if [ ! -x "$PY" ]; then
  python3 -m venv .venv
  PY=.venv/bin/python
  "$PY" -m pip install -e .
fi
"$PY" -m pip install --quiet pyinstaller pillow
"$PY" packaging/make_icons.py packaging/build/icons
