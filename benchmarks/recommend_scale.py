"""Recommend and compare on large results files. Goal: 200k records (~400 MB) analysed
in under 15 s with a peak memory under 1 GB.

Writes synthetic results files of realistic records (RunRecord.to_json, as the runner writes them:
128 output token ids from a 150k vocabulary, 128 token times, the prompt's 12-30 tokens: ~3 KB a
line, so 200k records are 600 MB, more than the issue's 400 MB) for 3 tasks x 7 prompts, arms
(baseline, K=1..4), 5 repetitions a sweep and sweeps appended one after another (greedy: a
prompt's runs give the same tokens, 0.5 % of MTP runs diverge; 0.3 % failed runs). Then, in a
fresh process per size, times the recommend command's path (load_records as the commands read
files, without the MTP runs' token times (mtp_times=False), analyze, parse_mix +
recommend, and the second read of the file for cost-probe records that the command makes) and
compare's path (load_records of two files, setting_changes, analyze both, compare), analysing every
record of the file (as for one sweep of that size). Prints seconds per stage, records per second
and the process's peak RSS (its own ru_maxrss).

    python benchmarks/recommend_scale.py [--sizes 10000,50000,200000] [--dir DIR] [--timeout 600]

Files are kept in --dir (default: a folder in the temp dir) and reused when present.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# not _common: it imports the calibrated-model writer (numpy, gguf), which would inflate the
# measured process's memory by what recommend never loads
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TASKS = ("story", "code", "tongue-twister")
PROMPTS_PER_TASK = 7  # as the built-in suites
KS = (None, 1, 2, 3, 4)
REPS = 5
N_PREDICT = 128
SPEEDUP = {"story": (1.0, 1.15, 1.2, 1.1, 1.0), "code": (1.0, 1.3, 1.5, 1.55, 1.5),
           "tongue-twister": (1.0, 0.95, 0.9, 0.85, 0.8)}


def generate(path: Path, n: int, seed: int, build: str = "b8000") -> None:
    """``n`` run records: sweeps of tasks x prompts x reps x arms (interleaved, arm order rotating
    per repetition) appended one after another, as repeated `mtp-tuner bench` runs make them."""
    from app.core.records.schema import SCHEMA_VERSION, RunRecord, tokens_sha256

    rng = random.Random(seed)
    prompts = [(task, f"{task}-{i}") for task in TASKS for i in range(PROMPTS_PER_TASK)]
    prompt_tokens = {p: tuple(rng.randrange(150_000) for _ in range(rng.randrange(12, 30))) for p in prompts}
    greedy = {p: [rng.randrange(150_000) for _ in range(N_PREDICT)] for p in prompts}
    host = {"os": "Linux-6.8.0-generic-x86_64-with-glibc2.39", "machine": "x86_64", "cpu_count": 16,
            "python": "3.11.7"}
    sampling = {"temperature": 0.0, "seed": 1, "raw": True, "ignore_eos": True}
    t = 1_767_225_600.0  # 2026-01-01
    written = 0
    sweep = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < n:
            sweep_id = f"{seed:04x}{sweep:08x}"
            drift = math.exp(rng.gauss(0, 0.05))
            for rep in range(REPS):
                for task, pid in prompts:
                    order = KS[rep % len(KS):] + KS[:rep % len(KS)]
                    for k in order:
                        if written >= n:
                            break
                        written += 1
                        base = 40.0 * drift * math.exp(rng.gauss(0, 0.03))
                        tok_s = base * SPEEDUP[task][KS.index(k)]
                        failed = rng.random() < 0.003
                        out = list(greedy[(task, pid)])
                        if k is not None and rng.random() < 0.005:  # an MTP run that diverges
                            out[rng.randrange(N_PREDICT)] = rng.randrange(150_000)
                        times, now = [], rng.uniform(0.05, 0.2)
                        for _ in range(N_PREDICT):
                            times.append(now)
                            now += rng.expovariate(1.0) / tok_s if k else rng.gauss(1 / tok_s, 0.02 / tok_s)
                        decode = (len(times) - 1) / (times[-1] - times[0])
                        drafted = accepted = None
                        if k is not None:
                            drafted = N_PREDICT // 2 * k
                            accepted = int(drafted * rng.uniform(0.4, 0.8))
                        ts = dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="milliseconds")
                        t += times[-1] + rng.uniform(0.2, 0.6)
                        rec = RunRecord(
                            schema_version=SCHEMA_VERSION, run_id=f"{rng.getrandbits(48):012x}", sweep_id=sweep_id,
                            status="failed" if failed else "ok", engine="inprocess",
                            arm_kind="baseline" if k is None else "mtp", k=k, p_min=None if k is None else 0.0,
                            task=task, prompt_id=pid, rep=rep, n_predict=N_PREDICT,
                            n_generated=0 if failed else N_PREDICT, tok_s=None if failed else decode,
                            tok_s_engine=None if failed else decode * 1.01, draft_n=drafted,
                            draft_accepted=accepted, acceptance=accepted / drafted if drafted else None,
                            mtp_engaged=None if k is None else True,
                            output_sha256=None if failed else tokens_sha256(out),
                            output_tokens=() if failed else tuple(out),
                            prompt_n=len(prompt_tokens[(task, pid)]), prompt_tokens=prompt_tokens[(task, pid)],
                            prompt_tok_s=850.0 * drift, llama_build=build,
                            model_path="/home/user/.cache/mtp-tuner/models/Qwen3.5-4B-MTP-Q4_K_M.gguf",
                            model_size=2_715_000_000, sampling=sampling,
                            token_times=() if failed else tuple(times), timestamp_utc=ts, host=host,
                            flags=(), error="llama-server exited (code -9)" if failed else None)
                        line = _line(rec)
                        if written == 1:
                            assert line == rec.to_json()
                        f.write(line + "\n")
            sweep += 1


def _line(rec) -> str:
    """RunRecord.to_json without its deep copy (dataclasses.asdict), which would make writing the
    files several times slower; the first line of each file is checked against to_json."""
    import dataclasses

    d = {"record_type": "run", **{f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}}
    d["output_tokens"] = list(rec.output_tokens)
    d["prompt_tokens"] = list(rec.prompt_tokens)
    d["token_times"] = [round(t, 6) for t in rec.token_times]
    d["flags"] = list(rec.flags)
    return json.dumps(d, ensure_ascii=False, separators=(",", ":"))


def child(kind: str, paths: list[str]) -> None:
    """Runs in a fresh process: times one command's path and prints a JSON line."""
    from app.core.analysis.analysis import analyze
    from app.core.analysis.compare import compare, setting_changes
    from app.core.analysis.recommend import parse_mix, recommend
    from app.core.records.reader import load_cost_records, load_records

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stages: dict[str, float] = {}
    t0 = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t0
        now = time.perf_counter()
        stages[name] = stages.get(name, 0.0) + now - t0
        t0 = now

    if kind == "recommend":
        recs = load_records(paths[0], mtp_times=False)  # as the commands read (cli._load_sweep)
        lap("load")
        a = analyze(recs)
        lap("analyze")
        pick, _ = recommend(a, parse_mix(None, a.tasks))
        lap("recommend")
        load_cost_records(paths[0])  # cmd_recommend reads the file again for cost-probe records
        lap("cost read")
        n = len(recs)
        summary = pick.reason
    else:
        ra = load_records(paths[0], mtp_times=False)
        rb = load_records(paths[1], mtp_times=False)
        lap("load")
        changes = setting_changes(ra, rb)
        lap("changes")
        rows = compare(analyze(ra), analyze(rb))
        lap("analyze")
        n = len(ra) + len(rb)
        summary = f"{len(rows)} rows, {len(changes)} change(s)"
    print(json.dumps({"n": n, "stages": stages, "rss0_kib": rss0,
                      "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "summary": summary}))


def run_child(kind: str, paths: list[Path], timeout: float) -> dict | None:
    try:
        p = subprocess.run([sys.executable, __file__, "--child", kind, *map(str, paths)], cwd=ROOT,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if p.returncode:
        raise SystemExit(f"{kind} failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,50000,200000")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "mtp-tuner-recommend-scale")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement")
    ap.add_argument("--skip-compare", action="store_true")
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in a.sizes.split(",")]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, files in {a.dir}")
    rows = []
    for n in sizes:
        files = []
        for seed, build in ((1, "b8000"), (2, "b8100")):
            path = a.dir / f"results-{n}-{seed}.jsonl"
            if not path.exists():
                t0 = time.monotonic()
                tmp = path.with_suffix(".part")
                generate(tmp, n, seed, build)
                tmp.rename(path)
                print(f"  wrote {path.name}: {path.stat().st_size / 1e6:.0f} MB in {time.monotonic() - t0:.0f} s",
                      file=sys.stderr, flush=True)
            files.append(path)
        mb = files[0].stat().st_size / 1e6
        rec = run_child("recommend", files[:1], a.timeout)
        cmp = None if a.skip_compare else run_child("compare", files, a.timeout)
        rows.append((n, mb, rec, cmp))
        _print(rows[-1], a.timeout, a.skip_compare)
    print()
    print(f"{'records':>8} {'MB':>5} | {'recommend s':>11} {'rec/s':>8} {'peak RSS':>9} | "
          f"{'compare s':>9} {'rec/s':>8} {'peak RSS':>9}")
    for n, mb, rec, cmp in rows:
        def cols(r: dict | None) -> str:
            if r is None:
                return f"{'> ' + format(a.timeout, '.0f'):>11} {'-':>8} {'-':>9}"
            s = sum(r["stages"].values())
            return f"{s:>11.1f} {r['n'] / s:>8.0f} {r['rss_kib'] / 1024:>6.0f} MB"
        print(f"{n:>8} {mb:>5.0f} | {cols(rec)} | " + (cols(cmp) if not a.skip_compare else "-"))
    n, mb, rec, _ = rows[-1]
    if rec is not None:
        s = sum(rec["stages"].values())
        ok = s < 15 and rec["rss_kib"] < 2**20
        print(f"goal (200k records under 15 s, under 1 GB): {n} records in {s:.1f} s, "
              f"{rec['rss_kib'] / 1024:.0f} MB: {'met' if ok else 'missed'}")


def _print(row, timeout: float, skip_compare: bool) -> None:
    n, mb, rec, cmp = row
    for kind, r in (("recommend", rec), ("compare", cmp)):
        if kind == "compare" and skip_compare:
            continue
        if r is None:
            print(f"{n:>7} records ({mb:.0f} MB) {kind}: did not finish in {timeout:.0f} s", flush=True)
            continue
        st = ", ".join(f"{k} {v:.2f} s" for k, v in r["stages"].items())
        print(f"{n:>7} records ({mb:.0f} MB) {kind}: {st}; peak RSS {r['rss_kib'] / 1024:.0f} MB "
              f"(after imports {r['rss0_kib'] / 1024:.0f} MB); {r['summary']}", flush=True)


if __name__ == "__main__":
    main()
