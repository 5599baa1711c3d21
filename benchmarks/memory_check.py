"""Memory per arm: the prediction (app.core.machine.arm_memory) against what llama-server itself
reports at load (its log: model buffer, KV buffer, RS buffer, compute buffer sizes), on the
calibrated hybrid model (qwen35: DeltaNet layers, so the recurrent rollback slots grow with K), at
K = 1, 2, 4 and the baseline, at two context sizes. Goal: every total within 5 %.

Not a timing measurement: it starts llama-server once per row, reads its load log and stops it.
Usage: python benchmarks/memory_check.py [--model FILE.gguf] [--ctx 4096,16384] [--k 0,1,2,4]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repository on sys.path)

from app.core.calibrated.demo import demo_model
from app.core.engines.commands import ServerConfig, build_server_argv
from app.core.engines.server.binary import find_server_binary, probe_capabilities
from app.core.engines.server.process import LOG_VERBOSITY, free_port
from app.core.machine.arm_memory import LoadSettings, predict
from app.core.machine.modelinfo import inspect

MIB = 2**20
ROWS = ("weights", "kv", "recurrent", "compute", "mtp_kv", "mtp_compute")
_MIB = r"= +([\d.]+) MiB"


def reported(log: str) -> dict[str, float]:
    """The sizes llama-server logs at load, in MiB, by the prediction's part names. The MTP draft
    context is the one created after "creating MTP draft context"; its compute buffer is the last
    reserve (the speculative set-up reserves it again)."""
    target, _, mtp = log.partition("creating MTP draft context")

    def reserves(text: str) -> list[float]:
        out = []
        for block in text.split("sched_reserve: reserving")[1:]:
            out.append(sum(float(x) for x in re.findall(r"compute buffer size " + _MIB, block)))
        return out

    def one(pattern: str, text: str) -> float:
        m = re.search(pattern, text)
        return float(m[1]) if m else 0.0

    got = {"weights": sum(float(x) for x in re.findall(r"model buffer size " + _MIB, log)),
           "kv": one(r"llama_kv_cache: size " + _MIB, target),
           "recurrent": one(r"llama_memory_recurrent: size " + _MIB, target),
           "compute": reserves(target)[0] if reserves(target) else 0.0,
           "mtp_kv": one(r"llama_kv_cache: size " + _MIB, mtp),
           "mtp_compute": reserves(mtp)[-1] if reserves(mtp) else 0.0}
    return got


def load_log(binary: str, caps, model: str, ctx: int, k: int) -> str:
    """llama-server's log up to "listening" for one configuration (k 0: the baseline)."""
    cfg = ServerConfig(model=model, spec_k=k or None, ctx_size=ctx, threads=1)
    port = free_port()
    argv = build_server_argv(binary, cfg, caps, host="127.0.0.1", port=port, verbosity=LOG_VERBOSITY)
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                out.seek(0)
                if "listening on" in out.read():
                    break
                time.sleep(0.2)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        out.seek(0)
        return out.read()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a hybrid GGUF (default: the calibrated demo model, qwen35)")
    ap.add_argument("--ctx", default="4096,16384")
    ap.add_argument("--k", default="0,1,2,4", help="draft widths (0: the baseline)")
    ap.add_argument("--server-bin")
    a = ap.parse_args()
    model = a.model or str(demo_model())
    binary = find_server_binary(a.server_bin)
    caps = probe_capabilities(binary)
    info = inspect(model)
    print(f"model {Path(model).name} ({info.arch}, {info.n_recurrent} recurrent + {info.n_full_attention} "
          f"attention layers), llama-server {caps.version}, CPU")
    print(f"{'ctx':>6} {'arm':<9} {'part':<12} {'predicted MiB':>14} {'reported MiB':>13} {'error':>8}")
    worst = 0.0
    for ctx in (int(x) for x in a.ctx.split(",")):
        for k in (int(x) for x in a.k.split(",")):
            got = reported(load_log(binary, caps, model, ctx, k))
            mem = predict(info, "draft-mtp" if k else None, k or None, LoadSettings(ctx=ctx))
            label = f"K={k}" if k else "baseline"
            for part in ROWS + ("total",):
                want = (mem.total if part == "total" else mem.parts[part]) / MIB
                have = sum(got.values()) if part == "total" else got[part]
                if not want and not have:
                    continue
                err = want / have - 1 if have else float("inf")
                if part == "total":
                    worst = max(worst, abs(err))
                print(f"{ctx:>6} {label:<9} {part:<12} {want:>14.2f} {have:>13.2f} {100 * err:>+7.1f}%")
    print(f"largest error of a total: {100 * worst:.1f} % (goal <= 5 %): {'PASS' if worst <= 0.05 else 'MISS'}")


if __name__ == "__main__":
    main()
