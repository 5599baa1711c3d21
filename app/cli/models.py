"""mtp-tuner models: the catalog and the models on this machine, Hub search, a repo's files, and
a resumable, verified download."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

from app.cli.common import EXIT_CANCELLED, EXIT_OK, Progress, warn
from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.common.paths import models_dir
from app.core.machine import hub, hub_download
from app.core.machine.download import progress_text
from app.core.machine.hardware import snapshot
from app.core.machine.modelinfo import size_text


def hub_token(args: argparse.Namespace) -> str | None:
    """The Hub token: from --token-file (an error when unreadable or empty), else HF_TOKEN."""
    if getattr(args, "token_file", None):
        p = Path(args.token_file).expanduser()
        try:
            tok = p.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise UserError(f"{p}: cannot read the token file ({e.strerror or e})") from None
        if not tok:
            raise UserError(f"{p}: the token file is empty")
        return tok
    return os.environ.get("HF_TOKEN") or None


def list_models(args: argparse.Namespace) -> int:
    cat = hub.load_catalog()
    local = hub.local_library(models_dir(), [Path(d) for d in args.dir])
    if args.json:
        print(json.dumps({"catalog": [dataclasses.asdict(e) for e in cat],
                          "local": [dataclasses.asdict(m) for m in local]}, indent=2))
        return EXIT_OK
    print("catalog (known MTP GGUF repos):")
    for e in cat:
        print(f"  {e.repo:<40} {e.arch:<10} {e.kind:<6} {e.notes}")
    print(f"\non this machine ({models_dir()}, the Hugging Face cache"
          + (", " + ", ".join(args.dir) if args.dir else "") + "):")
    for m in local:
        mtp = "MTP" if m.has_mtp else ("no MTP" if m.has_mtp is False else "unreadable")
        print(f"  {m.path}  {size_text(m.size)}  {m.arch or '?'}  {mtp}"
              + (f"  ({m.problem})" if m.problem else ""))
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
        for e in res:
            print(f"{e.repo:<45} {e.source:<8} {e.notes}")
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
    print(f"{rf.repo} at {rf.commit}")
    for why in rf.refused:
        print(f"  refused (not safe to save): {why}", file=sys.stderr)
    for q in rf.quants:
        parts = f" ({len(q.files)} parts)" if len(q.files) > 1 else ""
        badge = hub.size_fit(q.size, gpu, h.ram_total, moe)
        print(f"  {q.name:<12} {size_text(q.size):>11}  [{badge}]  {q.first.path}{parts}")
    return EXIT_OK


def download(args: argparse.Namespace, client: hub.HubClient) -> int:
    dest = Path(args.dest) if args.dest else models_dir()
    prog = Progress()
    result = None
    cancel = CancelToken()
    try:
        for ev in hub_download.download(client, args.repo, args.file, revision=args.revision, models_dir=dest,
                                        cancel=cancel, stall_timeout=args.stall_timeout):
            if isinstance(ev, hub_download.DownloadResult):
                result = ev
            else:
                prog.line(progress_text(ev))
    except KeyboardInterrupt:
        cancel.cancel()
        prog.line("cancelled; run the same command again to continue", final=True)
        return EXIT_CANCELLED
    prog.line("", final=False)
    assert result is not None
    mtp = {True: "MTP heads present", False: "NO MTP heads", None: "not inspected"}[result.has_mtp]
    if args.json:
        d = dataclasses.asdict(result)
        d["path"] = str(result.path)
        print(json.dumps(d, indent=2))
    else:
        print(f"{result.path}: {result.size:,} bytes, sha256 verified, commit {result.commit[:12]}; {mtp}"
              + (f" ({result.mtp_note})" if result.mtp_note else ""))
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if not args.models_cmd:
        raise UserError("models needs an action: list, search, files or download")
    if args.models_cmd == "list":
        return list_models(args)
    client = hub.HubClient(args.endpoint, hub_token(args))
    return {"search": search, "files": files, "download": download}[args.models_cmd](args, client)
