# Windows: build the frozen app from the spec, smoke-test it, zip the folder.
#   powershell -ExecutionPolicy Bypass -File packaging\build_windows.ps1
# Output: packaging\dist\mtp-tuner\mtp-tuner.exe and packaging\dist\mtp-tuner-<version>-windows-x64.zip
# (the name from packaging\archive_name.py; the release workflow uploads it)
# Optional installer: Inno Setup (iscc) over packaging\dist\mtp-tuner, if you want one; the zip is
# the supported download (unzip, double-click mtp-tuner.exe).
$ErrorActionPreference = "Stop"
Set-Location (Join-Path $PSScriptRoot "..")
$py = if ($env:PYTHON) { $env:PYTHON } else { ".venv\Scripts\python.exe" }
if (-not (Test-Path $py)) {
  py -3 -m venv .venv
  $py = ".venv\Scripts\python.exe"
  & $py -m pip install -e .
}
& $py -m pip install --quiet pyinstaller pillow
& $py packaging\make_icons.py packaging\build\icons
& $py -m PyInstaller --noconfirm --clean --log-level WARN --distpath packaging\dist `
  --workpath packaging\build\pyinstaller packaging\mtp_tuner.spec
if ($LASTEXITCODE -ne 0) { throw "PyInstaller failed" }
& $py packaging\smoke_test.py packaging\dist\mtp-tuner\mtp-tuner.exe
if ($LASTEXITCODE -ne 0) { throw "smoke test failed" }
$name = & $py packaging\archive_name.py
if ($LASTEXITCODE -ne 0) { throw "archive_name.py failed" }
$zip = "packaging\dist\$name"
if (Test-Path $zip) { Remove-Item $zip }
Compress-Archive -Path packaging\dist\mtp-tuner -DestinationPath $zip
Write-Host "archive: $zip"
# Signing (whoever holds a code-signing certificate):
#   signtool sign /fd SHA256 /tr http://timestamp.digicert.com /td SHA256 /a packaging\dist\mtp-tuner\mtp-tuner.exe
# before Compress-Archive; unsigned builds show SmartScreen's "Windows protected your PC" once.
