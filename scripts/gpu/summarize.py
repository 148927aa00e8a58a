#!/usr/bin/env python3
"""One stage of the GPU check (scripts/gpu/check.sh) in a line for summary.md — what it measured, beside what
gclab predicted — and its rows appended to $OUT/metrics.jsonl, tagged with the stage. Reads the stage's log,
its run folder (metrics.jsonl, memory.json, oom_report.json, bench.csv) and the estimate stage's JSON."""
import argparse
import csv
import json
import os
import re
import shutil

GIB = 1024.0**3


def gib(b):
    """Bytes for people: GiB from 1 GiB up, else MiB."""
    return f"{b / GIB:.2f} GiB" if b >= GIB else f"{b / 2**20:.1f} MiB"


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def append_rows(out, stage, rows):
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        for r in rows:
            f.write(json.dumps({"stage": stage, **r}) + "\n")


def estimate_of(path, cap_resolution=None):
    e = read_json(path) or {}
    e = e.get("estimate", e)
    per = {int(r["resolution"]): r for r in e.get("per_resolution", []) if "resolution" in r}
    return e.get("load", {}), per


def training_run(a, log):
    """A training stage: the load and each step's peak, measured, beside the estimate's; the OOM if any."""
    parts = []
    m = re.search(r"loaded: the device held at most (.+?) \(predicted (.+?)\)", log)
    if m:
        parts.append(f"load {m.group(1)} (predicted {m.group(2)})")
    rows = []
    metrics = os.path.join(a.run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as f:
            rows = [json.loads(l) for l in f if l.strip()]
        append_rows(a.out, a.stage, rows)
    load, per = estimate_of(a.estimate)
    policy = "gc_off" if a.stage == "oom_gc_off" else "gc_full"
    by_bucket = {}
    for r in rows:
        by_bucket[r.get("bucket", "?")] = max(by_bucket.get(r.get("bucket", "?"), 0), r.get("peak_bytes", 0))
    for bucket, peak in sorted(by_bucket.items()):
        # The estimate is per dataset resolution: a bucket belongs to the smallest one whose square holds it.
        dims = [int(x) for x in re.findall(r"\d+", str(bucket))]
        area = dims[0] * dims[1] if len(dims) == 2 else 0
        res = min((x for x in per if x * x >= area), default=None)
        predicted = per.get(res, {}).get(policy, {}).get("total") if res else None
        parts.append(
            f"step peak, bucket {bucket}: {gib(peak)}"
            + (f" (predicted {gib(predicted)} at {res}², {policy})" if predicted else "")
        )
    if rows:
        parts.append(f"{len(rows)} steps, {rows[-1].get('step_time_s', 0):.2f} s the last")
    oom = read_json(os.path.join(a.run_dir, "oom_report.json"))
    if oom:
        fix = oom.get("fixes", [{}])[0] if oom.get("fixes") else {}
        where = ", ".join(x for x in (oom.get("activity"), f"bucket {oom.get('bucket')}") if x)
        parts.append(
            f"OOM at step {oom.get('step')} in {oom.get('phase')} ({where}), peak {gib(oom.get('peak_bytes', 0))}; "
            f"first fix: {fix.get('change', '-')}"
        )
        for name in ("oom_report.md",):
            src = os.path.join(a.run_dir, name)
            if os.path.exists(src):
                shutil.copy(src, os.path.join(a.out, f"oom_report_{a.stage}.md"))
    return "; ".join(parts)


def bench_run(a, log):
    path = os.path.join(a.run_dir, "bench.csv")
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    append_rows(a.out, a.stage, rows)
    parts = []
    for r in rows:
        if r["oom"] == "1":
            parts.append(f"{r['resolution']} {r['policy']} {r.get('cap', '')}: OOM ({r['oom_phase']})")
            continue
        mfu = float(r.get("mfu") or 0)
        name = r["policy"] + (f" under {r['cap']} ({r['applied']})" if r.get("cap") else "")
        parts.append(
            f"{r['resolution']} {name}: {float(r['step_ms']):.0f} ms, {gib(int(r['peak_bytes']))} allocated / "
            f"{gib(int(r['reserved_peak_bytes']))} reserved" + (f", MFU {100 * mfu:.1f}%" if mfu else "")
        )
    return "; ".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--run-dir", default="")
    ap.add_argument("--estimate", default="")
    a = ap.parse_args()
    try:
        log = open(a.log, errors="replace").read()
    except OSError:
        log = ""
    s = a.stage
    if s == "setup":
        gpu = re.search(r"^nvidia-smi: (.*)$", log, re.M)
        torch = re.search(r"^(torch .*)$", log, re.M)
        problems = re.findall(r"^preflight: (.*)$", log, re.M)
        print("; ".join(x for x in [gpu and "GPU: " + gpu.group(1), torch and torch.group(1)] + problems[-3:] if x))
    elif s == "matmul":
        m = re.search(r"^matmul .*$", log, re.M)
        print(m.group(0) if m else "")
    elif s == "cuda_tests":
        verdicts = re.findall(r"^(PASSED|SKIPPED|FAILED) (\S+)", log, re.M)
        counts = {v: sum(1 for x, _ in verdicts if x == v) for v in ("PASSED", "SKIPPED", "FAILED")}
        failed = [t for v, t in verdicts if v == "FAILED"]
        print(
            f"{counts['PASSED']} passed, {counts['SKIPPED']} skipped, {counts['FAILED']} failed"
            + (f": {', '.join(failed)}" if failed else "")
        )
    elif s == "estimate":
        load, per = estimate_of(a.estimate)
        parts = [f"load {gib(load['device_peak'])}"] if "device_peak" in load else []
        for res, r in sorted(per.items()):
            parts.append(f"{res}: GC off {gib(r['gc_off']['total'])}, full {gib(r['gc_full']['total'])}")
        print("predicted " + "; ".join(parts) if parts else "")
    elif a.run_dir and s in ("bench", "uint4", "offload"):
        print(bench_run(a, log))
    elif a.run_dir:
        print(training_run(a, log))
    elif s == "fit":
        print("; ".join(l.strip() for l in log.splitlines() if re.match(r"^# \| \d", l)))
    elif s == "text_cuda":
        print("; ".join(l.strip() for l in log.splitlines() if l.startswith("| ") and "---" not in l)[:1500])
    elif s == "memory_snapshot":  # memory_snapshot_check.py's one JSON line
        m = re.search(r"^\{.*\}$", log, re.M)
        print(m.group(0)[:600] if m else "")


if __name__ == "__main__":
    main()
