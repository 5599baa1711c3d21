"""Hugging Face Hub: catalog of known MTP GGUF repos, live search, repo files with sizes and
sha256, a fit badge before download, and the models already on disk. Downloads are in
app.core.machine.hub_download, the checks of Hub names in app.core.machine.hub_names.

``huggingface_hub`` gives metadata, URLs and auth; the transfer itself is ours (see
hub_download).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Sequence
from urllib.parse import urlparse

from app.core.common.spec_modes import MTP
from app.core.common.errors import UserError, network_problem
from app.core.common import jsonsafe
from app.core.common.redact import redact, remember
from app.core.common.resources import resource
from app.core.machine.hub_names import SHA256_RE, SHA_RE, check_file_name, check_repo_id, check_revision
from app.core.machine.fit import DEVICE_MARGIN
from app.core.machine.hub_token import check_token
from app.core.machine.modelinfo import inspect

if TYPE_CHECKING:
    from huggingface_hub import HfApi

QUANT_RE = re.compile(r"(?:^|[-_.])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_[A-Z0-9]+)*))(?=[-_.])",
                      re.IGNORECASE)
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


class HubError(UserError):
    """A Hub request that failed; the message says why in plain words."""


def _prepare_env() -> None:
    """Settings ``huggingface_hub`` reads at import: no telemetry lookup, plain HTTP."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _hf() -> ModuleType:
    _prepare_env()
    import huggingface_hub  # deferred: heavy (httpx and more), needed only when the Hub is asked

    return huggingface_hub


# ------------------------------------------------------------------------------------------
# catalog


@dataclasses.dataclass(frozen=True)
class DrafterRef:
    """A catalog target's separate drafter: the Hub repo that holds it and a pattern (fnmatch) of
    its file name there; ``verified`` is False while the name has not been checked against the Hub."""

    repo: str
    file: str = "mtp-*.gguf"
    mode: str = MTP  # the --spec-type it drafts with
    kind: str = "gemma4-assistant"
    source: str | None = None  # the checkpoint it was converted from
    verified: bool = False


@dataclasses.dataclass(frozen=True)
class CatalogEntry:
    repo: str
    arch: str
    kind: str  # "dense" | "moe"
    notes: str
    drafter: DrafterRef | None = None  # a separate drafter GGUF (Gemma 4 assistant)
    source: str = "catalog"


CATALOG_KEYS = {"repo": str, "arch": str, "kind": str, "notes": str}
DRAFTER_KEYS = {"repo": str, "file": str, "mode": str, "kind": str, "source": str, "verified": bool}


def load_catalog(path: str | os.PathLike[str] | None = None) -> list[CatalogEntry]:
    p = Path(path) if path else resource("catalog.json")
    try:
        data = jsonsafe.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{p}: cannot read the model catalog ({err})") from None
    entries = data.get("models") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise UserError(f"{p}: the catalog needs a top-level 'models' list")
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise UserError(f"{p}: catalog entry {i + 1} is not an object")
        for k, t in CATALOG_KEYS.items():
            if not isinstance(e.get(k), t) or not e.get(k):
                raise UserError(f"{p}: catalog entry {i + 1} needs a non-empty {k!r}")
        if e["kind"] not in ("dense", "moe"):
            raise UserError(f"{p}: catalog entry {e['repo']}: kind must be dense or moe")
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", e["repo"]):
            raise UserError(f"{p}: catalog entry {i + 1}: {e['repo']!r} is not an owner/name repo id")
        out.append(CatalogEntry(e["repo"], e["arch"], e["kind"], e["notes"], _drafter_ref(p, e)))
    return out


def _drafter_ref(p: Path, e: dict[str, Any]) -> DrafterRef | None:
    """An entry's "drafter": {"repo", "file" pattern, "mode", "kind", "source", "verified"}, or a
    repo id alone (its mtp-*.gguf)."""
    d = e.get("drafter")
    if d is None:
        return None
    if isinstance(d, str):
        d = {"repo": d}
    if not isinstance(d, dict) or not isinstance(d.get("repo"), str):
        raise UserError(f"{p}: catalog entry {e['repo']}: 'drafter' needs a 'repo'")
    for k, v in d.items():
        if k not in DRAFTER_KEYS or not isinstance(v, DRAFTER_KEYS[k]):
            raise UserError(f"{p}: catalog entry {e['repo']}: drafter key {k!r} is unknown or of the wrong type")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", d["repo"]):
        raise UserError(f"{p}: catalog entry {e['repo']}: drafter repo {d['repo']!r} is not an owner/name repo id")
    return DrafterRef(**d)


def catalog_entry(repo: str, catalog: list[CatalogEntry] | None = None) -> CatalogEntry | None:
    """The catalog's entry for a repo id (the Hub's ids are case-insensitive), or None."""
    low = repo.lower()
    return next((e for e in (catalog if catalog is not None else load_catalog()) if e.repo.lower() == low), None)


def catalog_pair(model_path: str | os.PathLike[str]) -> CatalogEntry | None:
    """The catalog entry with a drafter of a model saved by a download (``models/owner__name/file``,
    hub_names.target_path), or None."""
    folder = Path(model_path).parent.name
    e = catalog_entry(folder.replace("__", "/", 1)) if "__" in folder else None
    return e if e is not None and e.drafter is not None else None


def _quant_bits(name: str) -> int:
    m = re.search(r"\d+", name)
    return int(m.group()) if m else 0


def pick_drafter(ref: DrafterRef, quants: tuple[Quant, ...] | list[Quant], target_file: str = "") -> Quant | None:
    """The quant of the drafter's repo whose file name matches ``ref.file``, chosen as llama.cpp
    picks a sibling (common/download.cpp find_best_sibling): the target's own quant when there is
    one, else the nearest bit width; None when no file matches."""
    found = [q for q in quants if fnmatch.fnmatch(Path(q.first.path).name, ref.file)]
    if not found:
        return None
    want = quant_name(target_file) if target_file else ""
    exact = [q for q in found if want and q.name == want]
    if exact:
        return exact[0]
    bits = _quant_bits(want) if want else 0
    return min(found, key=lambda q: (abs(_quant_bits(q.name) - bits) if bits else 0, q.size))


# ------------------------------------------------------------------------------------------
# client


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int | None
    sha256: str | None


@dataclasses.dataclass(frozen=True)
class Quant:
    name: str
    files: tuple[RemoteFile, ...]  # split parts in order

    @property
    def size(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def first(self) -> RemoteFile:
        return self.files[0]


@dataclasses.dataclass(frozen=True)
class RepoFiles:
    repo: str
    commit: str
    ggufs: tuple[RemoteFile, ...]
    quants: tuple[Quant, ...]
    refused: tuple[str, ...] = ()  # listed names not safe to save (each with the reason)


def quant_name(filename: str) -> str:
    stem = SPLIT_RE.sub(".gguf", Path(filename).name)
    matches = QUANT_RE.findall(stem)
    return matches[-1].upper() if matches else Path(stem).stem


def group_quants(files: list[RemoteFile]) -> list[Quant]:
    groups: dict[str, list[RemoteFile]] = {}
    for f in files:
        key = SPLIT_RE.sub("", f.path)
        groups.setdefault(key, []).append(f)
    out = []
    for key, fs in groups.items():
        fs.sort(key=lambda f: f.path)
        out.append(Quant(quant_name(fs[0].path), tuple(fs)))
    out.sort(key=lambda q: q.size)
    return out


class HubClient:
    def __init__(self, endpoint: str | None = None, token: str | None = None, timeout: float = 15.0):
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        remember(token)
        self._token = check_token(token.strip(), "the Hub token") if token else None
        self.timeout = timeout

    def __repr__(self) -> str:  # never show the token
        return f"HubClient({self.endpoint!r}, token={'set' if self._token else 'none'})"

    def _api(self) -> HfApi:
        api: HfApi = _hf().HfApi(endpoint=self.endpoint, token=self._token if self._token else False)
        return api

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as e:  # mapped to one plain sentence
            raise HubError(explain(e, what, self.endpoint)) from None

    def search(self, query: str, limit: int = 50) -> list[CatalogEntry]:
        """Hub repos whose id matches ``query`` and says GGUF and MTP. One request: ``list_models``
        retries a failed connection five times with back-off (about 24 s offline), so this
        asks once, with the client's own timeout, and an unreachable Hub is said at once."""
        hf = _hf()

        def call() -> list[Any]:
            r = hf.get_session().get(f"{self.endpoint}/api/models", params={"search": query, "limit": limit},
                                     headers=hf.utils.build_hf_headers(token=self._token or False),
                                     timeout=self.timeout)
            hf.utils.hf_raise_for_status(r)
            data = jsonsafe.loads(r.content)  # never RecursionError, whatever the answer nests
            if not isinstance(data, list):
                raise ValueError("the Hub's answer is not a list of models")
            return data

        out = []
        for m in self._call(f"search for {query!r}", call):
            rid = m.get("id") if isinstance(m, dict) else None
            if not isinstance(rid, str):
                continue
            low = rid.lower()
            if "gguf" in low and "mtp" in low:
                out.append(CatalogEntry(rid, "", "dense", "found by search", source="search"))
        return out

    def repo_files(self, repo: str, revision: str = "main") -> RepoFiles:
        check_repo_id(repo)
        check_revision(revision)
        info = self._call(f"listing the files of {repo}", lambda: self._api().model_info(
            repo, revision=revision, files_metadata=True, timeout=self.timeout))
        files, refused = [], []
        for s in info.siblings or []:
            name = getattr(s, "rfilename", None)
            if not isinstance(name, str) or not name.lower().endswith(".gguf"):
                continue
            try:
                check_file_name(name)
            except UserError as e:  # a hostile or broken listing: never offered for download
                refused.append(str(e))
                continue
            lfs = getattr(s, "lfs", None)
            sha = getattr(lfs, "sha256", None) if lfs is not None else None
            size = getattr(lfs, "size", None) if lfs is not None else None
            size = size if size is not None else s.size
            files.append(RemoteFile(name, size if _is_size(size) else None,
                                    sha if isinstance(sha, str) and SHA256_RE.fullmatch(sha) else None))
        commit = info.sha or revision
        if not isinstance(commit, str) or not (SHA_RE.fullmatch(commit) or commit == revision):
            raise HubError(f"listing {repo}: the Hub answered an invalid commit id {str(commit)[:80]!r}")
        return RepoFiles(repo, commit, tuple(files), tuple(group_quants(files)), tuple(refused))


def _is_size(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def size_fit(size: int, gpu_bytes: int | None, ram_bytes: int | None, moe: bool | None,
             overhead: float = 1.15) -> str:
    """A fit badge before download, from the file size alone (weights) plus ~15 % for KV cache,
    MTP context and buffers at a modest context, and on a GPU the 1 GiB llama.cpp keeps free;
    ``mtp-tuner inspect`` gives the exact figure after."""
    need = size * overhead
    if gpu_bytes:
        if need + DEVICE_MARGIN <= gpu_bytes:
            return "fits on GPU"
        if moe and ram_bytes and need - gpu_bytes < ram_bytes * 0.8:
            return "fits with --n-cpu-moe"
        if ram_bytes and need - gpu_bytes < ram_bytes * 0.8:
            return "partial offload (-ngl), slow"
        return "too large"
    if ram_bytes:
        return "fits in RAM (CPU)" if need <= ram_bytes * 0.8 else "too large"
    return "unknown"


def merged_search(client: HubClient | None, query: str, catalog: list[CatalogEntry]) -> list[CatalogEntry]:
    """Catalog entries matching the query first, then live results not already in the catalog."""
    q = query.lower()
    out = [e for e in catalog if q in e.repo.lower() or q in e.arch.lower()]
    if client is not None:
        known = {e.repo for e in catalog}
        out += [e for e in client.search(query) if e.repo not in known]
    return out


def explain(e: Exception, what: str, endpoint: str) -> str:
    """One sentence for a failed Hub request; never includes headers or the token (whatever
    the exception's text holds is redacted)."""
    return redact(_explain(e, what, endpoint))


def _explain(e: Exception, what: str, endpoint: str) -> str:
    name = type(e).__name__
    status = getattr(getattr(e, "response", None), "status_code", None)
    host = urlparse(endpoint).netloc or endpoint
    if name == "GatedRepoError":
        return (f"{what}: the repo is gated: accept its license on the Hub, then give a token "
                "with read access (--token-file or HF_TOKEN)")
    if name == "RepositoryNotFoundError":
        return f"{what}: no such repo on {host} (or it is private and needs a token)"
    if name == "RevisionNotFoundError":
        return f"{what}: no such revision"
    if name in ("RemoteEntryNotFoundError", "EntryNotFoundError"):
        return f"{what}: no such file in the repo"
    if name == "DisabledRepoError":
        return f"{what}: the repo is disabled on the Hub"
    if name == "OfflineModeIsEnabled":
        return f"{what}: offline mode is on (HF_HUB_OFFLINE)"
    offline = network_problem(e, host, what)  # no network, refused, no answer: one sentence
    if offline:
        return offline
    if status in (401, 403):
        return f"{what}: access denied ({status}); the repo may be gated or private: give a token"
    if status == 404:
        return f"{what}: not found (404)"
    if status:
        return f"{what}: the Hub answered {status}"
    return f"{what}: {name}: {str(e).splitlines()[0][:200] if str(e) else 'failed'}"


# ------------------------------------------------------------------------------------------
# local library


@dataclasses.dataclass(frozen=True)
class LocalModel:
    path: str
    size: int
    where: str  # "models folder", "Hugging Face cache", or a user folder
    has_mtp: bool | None
    arch: str | None
    problem: str | None


def local_library(models_dir: Path, extra_dirs: Sequence[Path] = (),
                  include_hf_cache: bool = True) -> list[LocalModel]:
    seen: set[str] = set()
    out: list[LocalModel] = []
    roots = [(Path(models_dir), "models folder")] + [(Path(d), str(d)) for d in extra_dirs]
    if include_hf_cache:
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" /
                                                                        "huggingface")) / "hub")
        roots.append((hub, "Hugging Face cache"))
    for root, where in roots:
        if not root.is_dir():
            continue
        for p in sorted(root.rglob("*.gguf")):
            if SPLIT_RE.search(p.name) and not p.name.endswith("-00001-of-" + p.name[-10:-5] + ".gguf"):
                continue  # later parts of a split model belong to its first part
            key = str(p.resolve())
            if key in seen:
                continue
            seen.add(key)
            try:
                info = inspect(p)
                out.append(LocalModel(str(p), info.file_size, where, info.has_mtp, info.arch, None))
            except UserError as e:
                out.append(LocalModel(str(p), p.stat().st_size if p.exists() else 0, where, None, None, str(e)))
    return out
