"""mtp-tuner runtime list|install|use|remove: llama.cpp builds from upstream releases, picked
for this machine, downloaded (resumable, sha256-checked), validated, kept side by side; the
selected one is the server engine's default llama-server."""

from __future__ import annotations

import argparse
import json
import sys

from app.cli.common import EXIT_CANCELLED, EXIT_OK, Progress
from app.cli.options import Parser, add_json
from app.core.machine.download import DownloadProgress, progress_text
from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.machine import runtime_choice, runtime_host, runtime_release, runtime_store

NAME = "runtime"
HELP = "llama.cpp builds from upstream releases for this machine (list, install, use, remove)"


def setup_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="runtime_cmd", metavar="ACTION", parser_class=Parser)
    add_json(actions.add_parser("list", help="the installed runtimes (* = selected)"))
    ri = actions.add_parser("install", help="download, validate and select the build for this machine")
    ri.add_argument("--asset", help="install this release asset instead of the one picked for this machine")
    ri.add_argument("--release-url", help="release API JSON (default: MTP_TUNER_RELEASES_URL, else the "
                    "latest ggml-org/llama.cpp release)")
    ri.add_argument("--releases", metavar="FILE", help="a recorded release listing (GitHub's release API JSON) "
                    "instead of asking GitHub")
    ri.add_argument("--no-select", action="store_true", help="install without selecting it")
    ri.add_argument("--dry-run", action="store_true", help="say what would be installed and why; download nothing")
    ri.add_argument("--host", metavar="FILE", help="with --dry-run: a described machine (JSON: os, arch, gpus, "
                    "vulkan_loader, hip_runtime; see docs/install.md) instead of this one")
    add_json(ri, help="with --dry-run: {asset, extras, backend, why, release}")
    for name, hlp in (("use", "select an installed runtime"), ("remove", "delete an installed runtime")):
        actions.add_parser(name, help=hlp).add_argument(
            "name", help="the runtime's name (see: mtp-tuner runtime list)")


def list_runtimes(args: argparse.Namespace) -> int:
    rts = runtime_store.installed()
    sel = runtime_store.selected()
    work = runtime_store.work_folders()  # installs still running, or left-overs that could not be removed
    if args.json:
        print(json.dumps({"selected": sel.name if sel else None, "folder": str(runtime_store.runtimes_dir()),
                          "runtimes": [r.to_dict() for r in rts],
                          "work_folders": [{"folder": str(w.folder), "pid": w.pid, "running": w.live,
                                            "bytes": w.size} for w in work]}, indent=2))
        return EXIT_OK
    if not rts:
        print(f"no llama.cpp runtimes installed (folder: {runtime_store.runtimes_dir()}); "
              "get one with: mtp-tuner runtime install")
    for r in rts:
        mark = "*" if sel and sel.name == r.name else " "
        devs = ", ".join(r.devices) if r.devices else "CPU only"
        print(f"{mark} {r.name:<24} {r.backend:<7} {r.version}  [{devs}]  {r.server}")
    if rts and sel is None:
        print("none selected: choose one with: mtp-tuner runtime use NAME")
    for w in work:
        print(f"  {w.text()}")
    return EXIT_OK


def _releases(args: argparse.Namespace) -> tuple[runtime_release.Release, ...]:
    if args.releases and args.release_url:
        raise UserError("--releases (a saved listing) and --release-url (where to ask) do not combine; give one")
    if args.releases:
        return runtime_release.load_releases(args.releases)
    return runtime_release.fetch_releases(args.release_url)


def _host(args: argparse.Namespace) -> runtime_host.Host:
    if args.host:
        return runtime_host.host_from_file(args.host)
    from app.core.machine.hardware import snapshot  # psutil and NVML: only when choosing by this machine

    return runtime_host.host_from_snapshot(snapshot())


def _choice(args: argparse.Namespace, releases: tuple[runtime_release.Release, ...]
            ) -> tuple[runtime_release.Release, runtime_choice.Choice, tuple[str, ...]]:
    if args.asset:
        rel = next((r for r in releases if any(a.name == args.asset for a in r.assets)), releases[0])
        return rel, runtime_choice.choice_for_asset(rel, args.asset), ()
    return runtime_choice.pick(_host(args), releases)


def dry_run(args: argparse.Namespace) -> int:
    """What would be installed and why, for this machine or the one ``--host`` describes; reads the
    release listing, downloads nothing."""
    release, choice, skipped = _choice(args, _releases(args))
    if args.json:
        print(json.dumps({"asset": choice.asset.name, "extras": [x.name for x in choice.extras],
                          "backend": choice.backend, "why": choice.why, "release": release.tag,
                          "skipped": list(skipped)}, indent=2))
        return EXIT_OK
    for text in skipped:
        print(text)
    print(f"release {release.tag} ({release.source})")
    print(f"would install: {choice.asset.name}" + "".join(f" + {x.name}" for x in choice.extras))
    print(f"backend: {choice.backend}")
    print(f"why: {choice.why}")
    print("nothing downloaded (--dry-run)")
    return EXIT_OK


def install(args: argparse.Namespace) -> int:
    from app.core.engines.server.runtime_install import Step, install as do_install  # process plumbing

    if args.dry_run:
        return dry_run(args)
    if args.host:
        raise UserError("--host describes another machine: use it with --dry-run (an install is for this machine)")
    release, choice, skipped = _choice(args, _releases(args))
    for text in skipped:
        print(text)
    print(f"release {release.tag} ({release.source})")
    print(f"chosen: {choice.asset.name}" + "".join(f" + {x.name}" for x in choice.extras))
    print(f"why: {choice.why}")
    prog = Progress()
    cancel = CancelToken()
    rt = None
    try:
        for ev in do_install(choice, release.tag, cancel=cancel, select=not args.no_select):
            if isinstance(ev, DownloadProgress):
                prog.line(progress_text(ev))
            elif isinstance(ev, Step):
                prog.line("", final=False)
                print(ev.text, flush=True)
            else:
                rt = ev
    except KeyboardInterrupt:
        cancel.cancel()
        prog.line("cancelled; run the same command again to continue the download", final=True)
        return EXIT_CANCELLED
    assert rt is not None
    print(f"installed {rt.name}: {rt.server}")
    if not args.no_select:
        print(f"selected {rt.name}: the server engine now uses this llama-server by default")
    return EXIT_OK


def use(args: argparse.Namespace) -> int:
    rt = runtime_store.select(args.name)
    print(f"selected {rt.name}: {rt.server}")
    return EXIT_OK


def remove(args: argparse.Namespace) -> int:
    rt = runtime_store.remove(args.name)
    print(f"removed {rt.name} ({rt.folder})")
    if runtime_store.selected() is None and runtime_store.installed():
        print("no runtime selected now: choose one with: mtp-tuner runtime use NAME", file=sys.stderr)
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if not args.runtime_cmd:
        raise UserError("runtime needs an action: list, install, use or remove")
    for text in runtime_store.clean_stale():  # what a killed install left behind
        print(text, file=sys.stderr)
    return {"list": list_runtimes, "install": install, "use": use, "remove": remove}[args.runtime_cmd](args)
