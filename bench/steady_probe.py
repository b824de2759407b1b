#!/usr/bin/env python3
"""One JSON line of counters for bench/steady.sh, taken before and after a job.

Usage: steady_probe.py DEVICE [SERVER_PIDS] [DATA_FILES]
  (PIDS and FILES comma-separated: a three-node cluster's counters are summed)
  device_sectors  512-byte sectors written to DEVICE (/proc/diskstats): every
                  writer on the disk, the other engineers' builds too
  server_write    bytes the server process sent towards storage
                  (/proc/PID/io write_bytes: a page counts when it turns dirty,
                  a direct write when it is submitted); only its own
  server_ticks    utime + stime of the server, in clock ticks
  file_*_pages    the data file's pages in the page cache, dirty, under
                  write-back (cachestat(2), Linux 6.5+)
  dirty_kib, writeback_kib  Dirty: and Writeback: of /proc/meminfo (system-wide)
"""
import ctypes, json, os, sys

device = sys.argv[1] if len(sys.argv) > 1 else ""
pids = [p for p in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if p]
paths = [p for p in (sys.argv[3] if len(sys.argv) > 3 else "").split(",") if p]
out = {}

for line in open("/proc/diskstats"):
    f = line.split()
    if device and f[2] == device:
        out["device_sectors"] = int(f[9])

for pid in pids:
    if not os.path.exists(f"/proc/{pid}/io"):
        continue
    for line in open(f"/proc/{pid}/io"):
        k, v = line.split(":")
        if k == "write_bytes":
            out["server_write"] = out.get("server_write", 0) + int(v)
    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    out["server_ticks"] = out.get("server_ticks", 0) + int(stat[11]) + int(stat[12])

for line in open("/proc/meminfo"):
    k, v = line.split(":")
    if k in ("Dirty", "Writeback"):
        out[k.lower() + "_kib"] = int(v.split()[0])


class Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


libc = ctypes.CDLL(None, use_errno=True)
for path in paths:
    if not os.path.exists(path):
        continue
    fd = os.open(path, os.O_RDONLY)
    try:
        st = Stat()
        SYS_CACHESTAT = 451  # the same number on every architecture
        if libc.syscall(SYS_CACHESTAT, fd, ctypes.byref(Range(0, 0)), ctypes.byref(st), 0) == 0:
            for key, value in (("cached", st.cache), ("dirty", st.dirty), ("writeback", st.writeback)):
                out[f"file_{key}_pages"] = out.get(f"file_{key}_pages", 0) + value
    finally:
        os.close(fd)
print(json.dumps(out))
