"""The wrapper's cost while it holds a lease idle: `leasehold run LOCK -- sleep` for WINDOW s.

Samples the leasehold process (not its child) after start-up and again WINDOW s later:
RSS high-water mark (VmHWM), CPU time (utime+stime from /proc/PID/stat, in clock ticks, and the
exact on-CPU ns from /proc/PID/task/*/schedstat), wakeups (voluntary context switches summed over
its threads), and the renewals it made (heartbeat_seq in LOCK).

usage: idle.py LEASEHOLD LOCK WINDOW_S OUT.json
"""

import glob
import json
import os
import subprocess
import sys
import time


def sample(pid):
    s = {"vcsw": 0, "nvcsw": 0, "sched_ns": 0, "threads": {}}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            st = dict(
                line.split(":", 1) for line in open(f"{task}/status").read().splitlines() if ":" in line
            )
            v = int(st["voluntary_ctxt_switches"])
            s["vcsw"] += v
            s["nvcsw"] += int(st["nonvoluntary_ctxt_switches"])
            s["sched_ns"] += int(open(f"{task}/schedstat").read().split()[0])
            s["threads"][st["Name"].strip()] = v
        except (OSError, KeyError, ValueError):
            pass
    status = dict(
        line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line
    )
    s["vmhwm_kib"] = int(status["VmHWM"].split()[0])
    s["vmrss_kib"] = int(status["VmRSS"].split()[0])
    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    s["ticks"] = int(stat[11]) + int(stat[12])  # utime + stime
    return s


def seq(lock):
    try:
        with open(lock) as f:
            lease = json.load(f)
        return lease.get("heartbeat_seq"), lease.get("ttl_ms")
    except (OSError, ValueError):
        return None, None


def main(lh, lock, window, out):
    window = float(window)
    p = subprocess.Popen([lh, "run", lock, "--", "sleep", str(window + 4)])
    try:
        time.sleep(1.5)
        a, (seq_a, ttl_ms) = sample(p.pid), seq(lock)
        t = time.monotonic()
        time.sleep(window)
        b, (seq_b, _) = sample(p.pid), seq(lock)
        dt = time.monotonic() - t
    finally:
        p.terminate()
        p.wait()
    hz = os.sysconf("SC_CLK_TCK")
    renewals = (seq_b - seq_a) if seq_a is not None and seq_b is not None else None
    res = {
        "window_s": dt,
        "ttl_ms": ttl_ms,
        "renewals": renewals,
        "wakeups": b["vcsw"] - a["vcsw"],
        "involuntary": b["nvcsw"] - a["nvcsw"],
        "wakeups_by_thread": {k: v - a["threads"].get(k, 0) for k, v in b["threads"].items()},
        "cpu_ms_schedstat": (b["sched_ns"] - a["sched_ns"]) / 1e6,
        "cpu_ms_stat_ticks": (b["ticks"] - a["ticks"]) * 1000 / hz,
        "cpu_ms_per_min": (b["sched_ns"] - a["sched_ns"]) / 1e6 * 60 / dt,
        "vmhwm_kib": b["vmhwm_kib"],
        "vmrss_kib": b["vmrss_kib"],
        "threads": len(b["threads"]),
    }
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res, indent=2), file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:])
