#!/usr/bin/env python3
"""Runs a command and reports its peak host memory, split as the load targets need it.

Usage: peak_rss.py LABEL -- CMD ARGS...
Samples /proc/<pid>/status every 50 ms: RssAnon (heap and anonymous mappings: what the process
itself holds), RssFile (pages of mapped files: the checkpoint's memory map, reclaimable) and
VmRSS. Prints one line `peak-rss LABEL: anon X MiB, file Y MiB, total Z MiB, wall W s, rc R` and
exits with the command's status. The peak of a 50 ms sampler can miss a shorter spike; the
kernel's own VmHWM (total, every page) is printed beside it as the bound that cannot.
"""
import subprocess
import sys
import time


def field(status, key):
    for line in status.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])  # kB
    return 0


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    label, cmd = sys.argv[1], sys.argv[3:]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd)
    anon = file_ = total = hwm = 0
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                s = f.read()
            anon = max(anon, field(s, "RssAnon"))
            file_ = max(file_, field(s, "RssFile"))
            total = max(total, field(s, "VmRSS"))
            hwm = max(hwm, field(s, "VmHWM"))
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.05)
    wall = time.monotonic() - t0
    print(f"peak-rss {label}: anon {anon >> 10} MiB, file {file_ >> 10} MiB, total {total >> 10} "
          f"MiB (VmHWM {hwm >> 10} MiB), wall {wall:.1f} s, rc {p.returncode}", flush=True)
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
