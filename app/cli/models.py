"""mtp-tuner models: the catalog and the models on this machine, Hub search, a repo's files, and
a resumable, verified download."""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import re
import sys
from pathlib import Path

from app.cli.common import EXIT_CANCELLED, EXIT_OK, Progress, warn
from app.cli.options import Parser, add_json, number
from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.common.paths import models_dir
from app.core.common.text import shown
from app.core.machine import drafter, hub, hub_download
from app.core.machine.download import progress_text
from app.core.machine.hardware import snapshot
from app.core.machine.hub_token import read_token
from app.core.machine.modelinfo import size_text

NAME = "models"
HELP = "find and download MTP GGUFs (catalog, Hub search, downloads)"


def setup_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="models_cmd", metavar="ACTION", parser_class=Parser)
    listing = actions.add_parser("list", help="the catalog and the models on this machine (offline)")
    listing.add_argument("--dir", action="append", default=[], help="another folder with GGUFs")
    add_json(listing)
    found = actions.add_parser("search", help="search the Hub for MTP GGUF repos")
    found.add_argument("query")
    _hub_arguments(found)
    repo = actions.add_parser("files", help="a repo's GGUF files")
    repo.add_argument("repo")
    _hub_arguments(repo)
    fetch = actions.add_parser("download", help="download one GGUF (resumable, sha256-verified)")
    fetch.add_argument("repo")
    fetch.add_argument("file")
    fetch.add_argument("--dest", help="models folder (default: the per-user models folder)")
    fetch.add_argument("--stall-timeout", type=number(0.0, lo_open=True), default=30.0,
                       help="give up when no data arrives for this many seconds")
    fetch.add_argument("--no-drafter", action="store_true",
                       help="for a catalog target with a drafter (Gemma 4): download the target only")
    _hub_arguments(fetch)


def _hub_arguments(p: argparse.ArgumentParser) -> None:
    """What every action that asks the Hub takes: the revision, the Hub's address and token, --json."""
    p.add_argument("--revision", default="main")
    p.add_argument("--endpoint", help="Hub address (default: HF_ENDPOINT or huggingface.co)")
    p.add_argument("--token-file",
                   help="file holding a Hub token, one line (default: HF_TOKEN, then HUGGING_FACE_HUB_TOKEN)")
    add_json(p)


def hub_token(args: argparse.Namespace) -> str | None:
    """The Hub token: from --token-file, else HF_TOKEN / HUGGING_FACE_HUB_TOKEN (hub_token.read_token)."""
    return read_token(getattr(args, "token_file", None))


def list_models(args: argparse.Namespace) -> int:
    cat = hub.load_catalog()
    local = hub.local_library(models_dir(), [Path(d) for d in args.dir])
    if args.json:
        print(json.dumps({"catalog": [dataclasses.asdict(e) for e in cat],
                          "local": [dataclasses.asdict(m) for m in local]}, indent=2))
        return EXIT_OK
    print("catalog (known MTP GGUF repos):")
    for e in cat:
        print(f"  {e.repo:<40} {e.arch:<10} {e.kind:<6} {e.notes}"
              + (f" [drafter: {e.drafter.repo} {e.drafter.file}]" if e.drafter else ""))
    print(f"\non this machine ({models_dir()}, the Hugging Face cache"
          + (", " + ", ".join(args.dir) if args.dir else "") + "):")
    for m in local:
        mtp = "MTP" if m.has_mtp else ("no MTP" if m.has_mtp is False else "unreadable")
        print(f"  {shown(m.path, 400)}  {size_text(m.size)}  {shown(m.arch or '?', 64)}  {mtp}"
              + (f"  ({shown(m.problem, 400)})" if m.problem else ""))
    if not local:
        print("  (none)")
    return EXIT_OK


def search(args: argparse.Namespace, client: hub.HubClient) -> int:
    catalog = hub.load_catalog()
    try:
        res = hub.merged_search(client, args.query, catalog)
    except hub.HubError as e:  # offline: said at once, and the catalog still answers
        res = hub.merged_search(None, args.query, catalog)
        if not res:
            raise
        warn(f"{e}; showing the catalog only")
    if args.json:
        print(json.dumps([dataclasses.asdict(e) for e in res], indent=2))
    else:
        for found in res:
            print(f"{shown(found.repo):<45} {found.source:<8} {shown(found.notes)}")
        if not res:
            print("no MTP GGUF repos found")
    return EXIT_OK


def files(args: argparse.Namespace, client: hub.HubClient) -> int:
    rf = client.repo_files(args.repo, args.revision)
    h = snapshot()
    gpu = h.gpus[0].vram_total if h.gpus else None
    kind = {e.repo: e.kind for e in hub.load_catalog()}.get(args.repo)
    moe = kind == "moe" if kind else bool(re.search(r"-A\d+B|moe", args.repo, re.IGNORECASE))
    if args.json:
        d = dataclasses.asdict(rf)
        d["fit"] = {q.name: hub.size_fit(q.size, gpu, h.ram_total, moe) for q in rf.quants}
        print(json.dumps(d, indent=2))
        return EXIT_OK
    print(f"{shown(rf.repo)} at {shown(rf.commit, 64)}")
    for why in rf.refused:
        print(f"  refused (not safe to save): {shown(why, 400)}", file=sys.stderr)
    for q in rf.quants:
        parts = f" ({len(q.files)} parts)" if len(q.files) > 1 else ""
        badge = hub.size_fit(q.size, gpu, h.ram_total, moe)
        print(f"  {shown(q.name, 40):<12} {size_text(q.size):>11}  [{badge}]  {shown(q.first.path, 400)}{parts}")
    return EXIT_OK


def _fetch(client: hub.HubClient, repo: str, file: str, revision: str, dest: Path, args: argparse.Namespace,
           prog: Progress, cancel: CancelToken, expected_sha256: str | None = None,
           expected_size: int | None = None) -> hub_download.DownloadResult:
    result = None
    for ev in hub_download.download(client, repo, file, revision=revision, models_dir=dest, cancel=cancel,
                                    stall_timeout=args.stall_timeout, expected_sha256=expected_sha256,
                                    expected_size=expected_size):
        if isinstance(ev, hub_download.DownloadResult):
            result = ev
        else:
            prog.line(progress_text(ev))
    prog.line("", final=False)
    assert result is not None
    return result


def _fetch_drafter(client: hub.HubClient, ref: hub.DrafterRef, args: argparse.Namespace, dest: Path,
                   prog: Progress, cancel: CancelToken) -> hub_download.DownloadResult | None:
    """The catalog pair's drafter, the quant nearest the target's (each split part resumable and
    verified), or None with a warning when the drafter repo has no file matching the pattern."""
    revision = args.revision if ref.repo.lower() == args.repo.lower() else "main"
    rf = client.repo_files(ref.repo, revision)
    q = hub.pick_drafter(ref, rf.quants, args.file)
    if q is None:
        warn(f"{args.repo}: the catalog's drafter ({ref.repo}, {ref.file}) is not among the repo's files at "
             f"{revision}" + ("" if ref.verified else " (the catalog has not checked that name against the Hub)")
             + "; get the drafter by hand, or pass --no-drafter")
        return None
    results = [_fetch(client, ref.repo, f.path, rf.commit, dest, args, prog, cancel, expected_sha256=f.sha256,
                      expected_size=f.size) for f in q.files]
    return results[0]


def download(args: argparse.Namespace, client: hub.HubClient) -> int:
    """One file, resumable and verified; for a catalog target with a drafter also the drafter (the
    pair), unless --no-drafter or the file asked for is the drafter itself."""
    dest = Path(args.dest) if args.dest else models_dir()
    prog = Progress()
    cancel = CancelToken()
    entry = hub.catalog_entry(args.repo)
    ref = entry.drafter if entry and not args.no_drafter else None
    if ref and ref.repo.lower() == args.repo.lower() and fnmatch.fnmatch(Path(args.file).name, ref.file):
        ref = None
    mode = ref.mode if ref else ""  # the pair's --spec-type (a drafter is fetched only with a ref)
    pair = None
    try:
        result = _fetch(client, args.repo, args.file, args.revision, dest, args, prog, cancel)
        pair = _fetch_drafter(client, ref, args, dest, prog, cancel) if ref else None
    except KeyboardInterrupt:
        cancel.cancel()
        prog.line("cancelled; run the same command again to continue", final=True)
        return EXIT_CANCELLED
    problem = None
    if pair is not None:
        try:
            drafter.check_pair(result.path, pair.path, mode)
        except UserError as e:
            problem = str(e)
            warn(f"the downloaded pair does not check: {problem}")
    mtp = {True: "MTP heads present", False: "NO MTP heads", None: "not inspected"}[result.has_mtp]
    if args.json:
        d = dataclasses.asdict(result)
        d["path"] = str(result.path)
        if pair is not None:
            d["drafter"] = {**dataclasses.asdict(pair), "path": str(pair.path), "mode": mode,
                            "pair_problem": problem}
        print(json.dumps(d, indent=2))
        return EXIT_OK
    print(f"{result.path}: {result.size:,} bytes, sha256 verified, commit {result.commit[:12]}; {mtp}"
          + (f" ({result.mtp_note})" if result.mtp_note else ""))
    if pair is not None:
        print(f"{pair.path}: {pair.size:,} bytes, sha256 verified, commit {pair.commit[:12]}; the drafter "
              f"(-md) of {args.repo}")
        if problem is None:
            print(f"pair: -m {result.path} -md {pair.path} --spec-type {mode}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if not args.models_cmd:
        raise UserError("models needs an action: list, search, files or download")
    if args.models_cmd == "list":
        return list_models(args)
    client = hub.HubClient(args.endpoint, hub_token(args))
    return {"search": search, "files": files, "download": download}[args.models_cmd](args, client)
