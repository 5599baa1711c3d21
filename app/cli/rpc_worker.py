"""mtp-tuner rpc-worker: run llama.cpp's RPC worker (ggml-rpc-server) of the selected llama.cpp on
this machine, for a main machine to split a model onto with ``--rpc HOST:PORT``. It listens on
127.0.0.1 unless ``--host`` says otherwise (and then the upstream warning comes first: the RPC
backend is unauthenticated), and it lives exactly as long as this command: Ctrl-C and SIGTERM stop
it, and on Linux it dies with the command even when the command is killed outright."""

from __future__ import annotations

import argparse
import ipaddress
import re
import signal
import socket
import sys
import time

from app.cli.common import EXIT_CANCELLED, EXIT_FAILED, on_signal
from app.cli.options import whole
from app.core.common.errors import UserError
from app.core.engines.server.binary import find_server_binary
from app.core.engines.server.rpc_check import devices_text, version_text, worker_info
from app.core.engines.server.rpc_worker import (LOOPBACK, REMOTE_WARNING, Endpoint, RpcWorker, find_worker,
                                                 is_loopback, worker_problem)

NAME = "rpc-worker"
HELP = "run an RPC worker of the selected llama.cpp here, for a main machine's --rpc (until Ctrl-C)"


def setup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", type=_listen_address, default=LOOPBACK, help=f"IPv4 address to listen on (default "
                   f"{LOOPBACK}: this machine only; localhost is taken as {LOOPBACK}); any other address is "
                   "reachable from the network, and the RPC backend is unauthenticated: only on a network you trust")
    p.add_argument("--port", type=whole(0, 65535), default=0, help="port to listen on (default 0: a free "
                   "one, printed)")
    p.add_argument("--threads", type=whole(1, 1024), help="CPU threads of the worker (default: llama.cpp's)")
    p.add_argument("--device", type=_devices, help="the worker's devices, comma-separated as llama.cpp names "
                   "them (e.g. CUDA0,CUDA1; default: all)")
    p.add_argument("--server-bin", help="llama-server binary or release folder whose worker to run "
                   "(default: the selected runtime, then PATH)")


def _devices(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}(,[A-Za-z0-9_.:-]{1,64}){0,63}", text):
        raise argparse.ArgumentTypeError(f"expected device names separated by commas, e.g. CUDA0,CUDA1; "
                                         f"got {text[:80]!r}")
    return text


WILDCARDS = ("0.0.0.0",)


def _listen_address(text: str) -> str:
    """--host: an IPv4 address, as llama.cpp's worker binds one (ggml-rpc's server socket is IPv4
    and takes no host name: it would exit at start, and the message would blame the port);
    ``localhost`` is 127.0.0.1."""
    host = text.strip()
    if host.lower() == "localhost":
        return LOOPBACK
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:80]!r} is not an IPv4 address: llama.cpp's RPC worker listens on "
                                         f"an address, not a host name (e.g. {LOOPBACK}, or this machine's "
                                         "address on the network, such as 192.168.1.20)") from None
    if address.version != 4:
        raise argparse.ArgumentTypeError(f"{text[:80]!r} is an IPv6 address: llama.cpp's RPC worker listens on IPv4 "
                                         f"only ({LOOPBACK} for this machine alone, 0.0.0.0 for every network)")
    return str(address)


def _address_for_others(host: str) -> str:
    """What the main machine should dial: the host given, or for a wildcard address this machine's
    address on its default route (found without sending anything)."""
    if host not in WILDCARDS:
        return host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET: UDP connect picks a route, sends nothing
            return str(s.getsockname()[0])
    except OSError:
        return "THIS-MACHINE'S-ADDRESS"


def run(args: argparse.Namespace) -> int:
    server = find_server_binary(args.server_bin)
    binary = find_worker(server)
    if binary is None:
        raise UserError(worker_problem(server) or "no RPC worker")
    remote = not is_loopback(args.host)
    if remote:
        print(REMOTE_WARNING.format(where=f"{args.host} port {args.port or '(a free one)'}"), file=sys.stderr,
              flush=True)
    worker = RpcWorker(binary, host=args.host, port=args.port, threads=args.threads, device=args.device,
                       allow_remote=remote, log=sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None)
    # SIGTERM stops the worker as Ctrl-C does; SIGKILL cannot be caught, and then the worker dies
    # with us on Linux (RpcWorker's process group and PR_SET_PDEATHSIG)
    with on_signal(signal.SIGTERM, signal.default_int_handler):
        try:
            code = _serve(worker, args.host, binary)
        except KeyboardInterrupt:
            print("RPC worker stopped", flush=True)
            return EXIT_CANCELLED
    print(f"the RPC worker exited on its own (exit code {code})", file=sys.stderr)
    return EXIT_FAILED


def _serve(worker: RpcWorker, host: str, binary: str) -> int | None:
    """Start the worker, say where it listens, and wait; its exit code if it ends on its own."""
    with worker:
        dial = Endpoint(_address_for_others(host), worker.endpoint.port)
        info = worker_info(Endpoint(LOOPBACK if host in WILDCARDS else host, worker.endpoint.port))
        print(f"RPC worker listening on {worker.endpoint} ({binary}, RPC protocol {version_text(info.version)}; "
              f"{devices_text(info.devices)})", flush=True)
        print(f"on the main machine: --rpc {dial}   (llama-server, or mtp-tuner bench/probe/recommend)",
              flush=True)
        print("Ctrl-C stops it", flush=True)
        while worker.running:
            time.sleep(0.2)
        return worker.proc.returncode if worker.proc else None
