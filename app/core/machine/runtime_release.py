"""A llama.cpp release as upstream publishes it: GitHub's release API JSON (asset names, sizes,
``digest: "sha256:..."``), read from https only (plain http only to this machine), bounded in
size, a hostile answer one line; or a listing saved to a file. What to take from it is
runtime_choice's job."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any
from urllib.parse import urlsplit

from app.core.common import jsonsafe, units
from app.core.common.errors import UserError, network_problem
from app.core.common.reading import read_capped
from app.core.common.text import shown
from app.core.machine.runtimes import RuntimeInstallError

RELEASES_URL_ENV = "MTP_TUNER_RELEASES_URL"
# the recent releases, newest first: "latest" may be a tag that holds no binaries (runtime_choice.pick)
DEFAULT_RELEASES_URL = "https://api.github.com/repos/ggml-org/llama.cpp/releases?per_page=20"
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclasses.dataclass(frozen=True)
class Asset:
    name: str
    size: int
    url: str
    sha256: str | None  # from the API's ``digest`` ("sha256:<hex>"); None when the release gives none


@dataclasses.dataclass(frozen=True)
class Release:
    tag: str
    assets: tuple[Asset, ...]
    source: str  # the URL (or file) it was read from


def releases_url() -> str:
    return os.environ.get(RELEASES_URL_ENV) or DEFAULT_RELEASES_URL


_LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_RELEASE_BYTES = 16 << 20  # GitHub's answer for a release with its notes: well under 1 MiB


def check_url(url: str, what: str) -> str:
    """``url`` when it is https:// (or http:// to this machine: a local mirror, the tests' release
    server), else RuntimeInstallError: no file://, ftp:// or plain http to another host."""
    try:
        u = urlsplit(url)
        allowed = bool(u.hostname) and (u.scheme == "https" or (u.scheme == "http" and u.hostname in _LOOPBACK))
    except ValueError:  # not a URL (a stray bracket, a bad port)
        allowed = False
    if allowed:
        return url
    raise RuntimeInstallError(f"{url[:200]!r}: {what} is not an https:// URL (plain http:// only to this "
                              "machine: 127.0.0.1 or localhost); refused")


def parse_releases(obj: Any, source: str) -> tuple[Release, ...]:
    """The releases of the API's JSON: one release object, or a listing (a list of them, as
    ``/releases`` answers). Drafts are left out."""
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        raise RuntimeInstallError(f"{source}: the release list is empty")
    out = tuple(_parse_one(o, source) for o in items if not (isinstance(o, dict) and o.get("draft") is True))
    if not out:
        raise RuntimeInstallError(f"{source}: the release list holds only drafts")
    return out


def parse_release(obj: Any, source: str) -> Release:
    """A release from the API's JSON (one release object, or a list whose first is taken)."""
    if isinstance(obj, list):
        if not obj:
            raise RuntimeInstallError(f"{source}: the release list is empty")
        obj = obj[0]
    return _parse_one(obj, source)


def _parse_one(obj: Any, source: str) -> Release:
    if not isinstance(obj, dict) or not isinstance(obj.get("assets"), list):
        raise RuntimeInstallError(f"{source}: not a GitHub release (no 'assets' list)")
    tag = obj.get("tag_name")
    if not isinstance(tag, str) or not tag.strip():
        raise RuntimeInstallError(f"{source}: the release has no 'tag_name'")
    tag = shown(tag, 100)  # outside text: shown in lines and names, so one escaped line
    assets = []
    for i, a in enumerate(obj["assets"]):
        if not isinstance(a, dict):
            raise RuntimeInstallError(f"{source}: asset {i + 1} is not an object")
        name, size, url = a.get("name"), a.get("size"), a.get("browser_download_url")
        if not isinstance(name, str) or not name or not isinstance(url, str) or not url:
            raise RuntimeInstallError(f"{source}: asset {i + 1} has no name or download URL")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RuntimeInstallError(f"{source}: asset {name!r} has no usable size ({size!r})")
        digest = a.get("digest")
        sha = None
        if isinstance(digest, str) and digest.startswith("sha256:"):
            sha = digest[len("sha256:"):].lower()
            if not SHA256_HEX.fullmatch(sha):
                raise RuntimeInstallError(f"{source}: asset {name!r} has a malformed digest {digest[:80]!r}")
        assets.append(Asset(name, size, url, sha))
    return Release(tag, tuple(assets), source)


def fetch_release(url: str | None = None, timeout: float = 20.0) -> Release:
    """Read the release JSON from ``url`` (default: $MTP_TUNER_RELEASES_URL, else the recent
    ggml-org/llama.cpp releases on GitHub); of a listing, the first."""
    return parse_release(_fetch_json(url, timeout), url or releases_url())


def fetch_releases(url: str | None = None, timeout: float = 20.0) -> tuple[Release, ...]:
    """Every release the JSON at ``url`` holds (one release, or a listing); see :func:`pick`."""
    return parse_releases(_fetch_json(url, timeout), url or releases_url())


def load_releases(path: "str | os.PathLike[str]") -> tuple[Release, ...]:
    """A recorded release listing (``runtime install --releases FILE``): what GitHub's release API
    answered, saved to a file. Raises RuntimeInstallError naming the file and the cause."""
    where = os.fspath(path)
    try:  # only a regular file: a FIFO is refused at once, not waited on
        raw = read_capped(path, "release listing", MAX_RELEASE_BYTES)
    except UserError as e:
        raise RuntimeInstallError(str(e)) from None
    try:
        obj = jsonsafe.loads(raw)
    except jsonsafe.TooDeep:
        raise RuntimeInstallError(f"{where}: nested too deeply to be a release listing") from None
    except ValueError as e:
        raise RuntimeInstallError(f"{where}: not JSON ({str(e).splitlines()[0][:120]})") from None
    return parse_releases(obj, where)


def _fetch_json(url: str | None, timeout: float) -> Any:
    import httpx2  # deferred: heavy

    url = check_url(url or releases_url(), "the llama.cpp release URL")
    body = bytearray()
    try:
        with httpx2.stream("GET", url, headers={"Accept": "application/vnd.github+json"}, timeout=timeout,
                           follow_redirects=True) as r:
            if r.status_code >= 400:
                raise RuntimeInstallError(f"{url}: cannot read the llama.cpp release (the server answered "
                                          f"{r.status_code})")
            check_url(str(r.url), "the llama.cpp release URL (redirected)")
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > MAX_RELEASE_BYTES:
                    raise RuntimeInstallError(f"{url}: the release answer is over {units.size(MAX_RELEASE_BYTES)}; "
                                              "not a GitHub release, refused")
    except httpx2.HTTPError as e:
        offline = network_problem(e, urlsplit(url).hostname or url, "read the latest llama.cpp release")
        if offline:  # no network, refused, no answer: one plain sentence
            raise RuntimeInstallError(offline) from None
        raise RuntimeInstallError(f"{url}: cannot read the llama.cpp release ({type(e).__name__}: "
                            f"{str(e).splitlines()[0][:160] if str(e) else 'no answer'})") from None
    try:
        return jsonsafe.loads(bytes(body))
    except jsonsafe.TooDeep:
        raise RuntimeInstallError(f"{url}: the release answer is nested too deeply to be a GitHub release; "
                                  "refused") from None
    except ValueError:
        raise RuntimeInstallError(f"{url}: the release answer is not JSON") from None
