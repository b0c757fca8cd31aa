"""Uncontended acquire+release of Python filelock's FileLock and SoftFileLease (library defaults),
on each directory given, for benches/compare/report.py. Median of per-run means.

usage: py_ops.py OUT.json LABEL=DIR [LABEL=DIR ...]   (LEASEHOLD_BENCH_QUICK=1 for a short run)
"""

import json
import os
import statistics
import sys
import time

import filelock

QUICK = os.environ.get("LEASEHOLD_BENCH_QUICK") == "1"
RUNS, OPS = (3, 300) if QUICK else (7, 2000)


def measure(cls, path):
    lock = cls(path)
    for _ in range(100):
        lock.acquire()
        lock.release()
    means = []
    for _ in range(RUNS):
        t = time.perf_counter_ns()
        for _ in range(OPS):
            lock.acquire()
            lock.release()
        means.append((time.perf_counter_ns() - t) / OPS / 1e3)
    return {"median_us": statistics.median(means), "min_us": min(means), "max_us": max(means)}


def main(out, pairs):
    res = {"filelock_version": filelock.__version__, "runs": RUNS, "ops": OPS, "results": {}}
    for pair in pairs:
        label, d = pair.split("=", 1)
        os.makedirs(d, exist_ok=True)
        res["results"][label] = {
            "filelock": measure(filelock.FileLock, os.path.join(d, "py-ops-filelock.lock")),
            "softfilelease": measure(filelock.SoftFileLease, os.path.join(d, "py-ops-soft.lock")),
        }
    with open(out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
