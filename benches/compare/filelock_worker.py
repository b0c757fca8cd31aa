"""Python filelock worker for benches/contention.rs: the same stdin/stdout protocol as the Rust
worker (`contention worker IMPL PHASE LOCK HOLD_MIN_US HOLD_MAX_US THINK_US RECORD`).

IMPL is `filelock` (filelock.FileLock) or `softfilelease` (filelock.SoftFileLease), both with the
library's defaults. Stamps are time.monotonic_ns() = CLOCK_MONOTONIC on Linux.
"""

import os
import random
import sys
import time

import filelock


def make(kind, path):
    if kind == "filelock":
        return filelock.FileLock(path)
    if kind == "softfilelease":
        return filelock.SoftFileLease(path)
    raise SystemExit(f"unknown impl {kind}")


def say(s):
    sys.stdout.write(s + "\n")
    sys.stdout.flush()


def main(argv):
    kind, phase, path, hold_min, hold_max, think, record = argv
    hold_min, hold_max, think = int(hold_min), int(hold_max), int(think)
    record = record == "1"
    lock = make(kind, path)
    now = time.monotonic_ns
    if phase == "hold":
        lock.acquire()
        say("held")
        time.sleep(3600)
        return
    if phase == "take":
        say("waiting")
        lock.acquire(timeout=20)
        say(f"got {now()}")
        lock.release()
        return
    if phase != "loop":
        raise SystemExit(f"unknown phase {phase}")
    say("ready")
    words = sys.stdin.readline().split()
    if len(words) != 3 or words[0] != "go":
        raise SystemExit(f"expected 'go START END', got {words}")
    start, end = int(words[1]), int(words[2])
    rng = random.Random(os.getpid() ^ start)
    left = (start - now()) / 1e9
    if left > 0:
        time.sleep(left)
    count = worst = 0
    recs = []
    while True:
        ws = now()
        if ws >= end:
            break
        try:
            lock.acquire(timeout=max((end - ws) / 1e9, 0.0))
        except filelock.Timeout:
            break
        t1 = now()
        if hold_max > 0:
            time.sleep(rng.randrange(hold_min, hold_max) / 1e6)
        t0 = now()
        lock.release()
        if t1 <= end:
            count += 1
            worst = max(worst, t1 - ws)
            if record and len(recs) < 200_000:
                recs.append((ws, t1, t0))
        if think > 0:
            time.sleep(think / 1e6)
    out = [f"count {count}", f"worst {worst}"]
    out += [f"rec {a} {b} {c}" for a, b, c in recs]
    out.append("done")
    sys.stdout.write("\n".join(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
