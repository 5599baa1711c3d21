#!/usr/bin/env bash
# macOS: build "MTP Tuner.app" from the spec, smoke-test it, pack it in a .dmg.
#   bash packaging/build_macos.sh
# Output: packaging/dist/MTP Tuner.app and packaging/dist/mtp-tuner-<version>-macos-arm64.dmg
# (the name from packaging/archive_name.py; the release workflow uploads it)
#
# Signing and notarizing (whoever holds an Apple Developer ID; skipped when the variables are unset):
#   MACOS_SIGN_IDENTITY="Developer ID Application: NAME (TEAMID)"
#   MACOS_NOTARY_PROFILE=<a profile stored with: xcrun notarytool store-credentials>
# Steps done below when set: codesign --deep --options runtime --timestamp the .app, build the DMG,
# codesign the DMG, xcrun notarytool submit --wait, xcrun stapler staple. Unsigned builds open with
# right-click > Open the first time (Gatekeeper).
set -euo pipefail
cd "$(dirname "$0")/.."
source packaging/_prepare.sh
"$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
  --distpath packaging/dist --workpath packaging/build/pyinstaller packaging/mtp_tuner.spec
APP="packaging/dist/MTP Tuner.app"
"$PY" packaging/smoke_test.py "$APP/Contents/MacOS/MTP Tuner"
if [ -n "${MACOS_SIGN_IDENTITY:-}" ]; then
  codesign --deep --force --options runtime --timestamp --sign "$MACOS_SIGN_IDENTITY" "$APP"
fi
DMG="packaging/dist/$("$PY" packaging/archive_name.py)"
rm -f "$DMG"
STAGE=$(mktemp -d)
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
hdiutil create -volname "MTP Tuner" -srcfolder "$STAGE" -ov -format UDZO "$DMG"
rm -rf "$STAGE"
if [ -n "${MACOS_SIGN_IDENTITY:-}" ]; then
  codesign --force --timestamp --sign "$MACOS_SIGN_IDENTITY" "$DMG"
  if [ -n "${MACOS_NOTARY_PROFILE:-}" ]; then
    xcrun notarytool submit "$DMG" --keychain-profile "$MACOS_NOTARY_PROFILE" --wait
    xcrun stapler staple "$DMG"
  fi
fi
echo "dmg: $DMG"
