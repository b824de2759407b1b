#!/usr/bin/env python3
"""bench/steady.sh's arithmetic.

steady_report.py step TARGET REP STEP JOB BASE PIECES T0 T1 BEFORE AFTER
    joins the fio runs BASE.0.json .. BASE.(PIECES-1).json of one job (json+
    latency bins and 10 s IOPS logs) and prints one JSON result line.
steady_report.py table RESULTS.jsonl OUT.md
    writes the steady-state section of OUT.md from the result lines.
"""
import datetime, glob, json, os, platform, statistics, subprocess, sys

SPARK = "▁▂▃▄▅▆▇█"
DESC = {"J1": "4k randwrite QD1 fsync=1", "J2": "4k randwrite QD32", "J3": "4k randread QD32",
        "J4": "4k randrw 50/50 QD16 x4 jobs", "J5": "128k seq write QD16", "J6": "128k seq read QD16"}
WRITE_JOBS = ("J1", "J2", "J4", "J5")


def percentile(bins, q):
    total = sum(bins.values())
    if not total:
        return None
    want = q / 100.0 * total
    seen = 0
    for ns in sorted(bins):
        seen += bins[ns]
        if seen >= want:
            return ns / 1000.0
    return max(bins) / 1000.0


def step(argv):
    target, rep, stepno, job, base, pieces, t0, t1, before, after = argv
    before, after = json.loads(before), json.loads(after)
    bins = {"read": {}, "write": {}}
    maxima = {"read": 0, "write": 0}
    ios = 0
    bytes_rw = {"read": 0, "write": 0}
    seconds = 0.0
    windows = {}
    offset_ms = 0
    sync_bins = {}
    for piece in range(int(pieces)):
        d = json.load(open(f"{base}.{piece}.json"))
        j = d["jobs"][0]
        runtime_ms = 0
        for dirn in ("read", "write"):
            s = j[dirn]
            if not s["io_bytes"]:
                continue
            ios += s["total_ios"]
            bytes_rw[dirn] += s["io_bytes"]
            runtime_ms = max(runtime_ms, s["runtime"])
            for ns, count in s["clat_ns"].get("bins", {}).items():
                bins[dirn][int(ns)] = bins[dirn].get(int(ns), 0) + count
            maxima[dirn] = max(maxima[dirn], s["clat_ns"]["max"] / 1000.0)
        for ns, count in j.get("sync", {}).get("lat_ns", {}).get("bins", {}).items():
            sync_bins[int(ns)] = sync_bins.get(int(ns), 0) + count
        seconds += runtime_ms / 1000.0
        for log in glob.glob(f"{base}.{piece}_iops.*.log"):
            for line in open(log):
                f = [x.strip() for x in line.split(",")]
                if len(f) < 2:
                    continue
                # A sample at t ms averages the window ending at t; the
                # jobs of one fio run log a millisecond or so apart
                # (9999, 10000, 20001), so t is rounded to the window's
                # end, or a job's sample fell into the next window.
                w = (offset_ms + int(f[0]) + 5000) // 10000 - 1
                windows[w] = windows.get(w, 0) + int(f[1])
        offset_ms += runtime_ms
    curve = [windows[w] for w in sorted(windows)]
    # The last window is usually partial (the job ended inside it).
    full = curve[:-1] if len(curve) > 2 else curve
    med = statistics.median(full) if full else None
    worst = (min(full[1:]) / med) if med and len(full) > 1 else None
    top = max(curve) if curve else 0
    spark = "".join(SPARK[min(7, int(v / top * 8))] if top else " " for v in curve)
    lat = {}
    for name, q in (("p50", 50), ("p99", 99), ("p999", 99.9)):
        vals = [percentile(bins[d], q) for d in ("read", "write") if bins[d]]
        lat[name] = max(vals) if vals else None
    wall = float(t1) - float(t0)
    client_written = bytes_rw["write"]

    def delta(key):
        if key in before and key in after:
            return after[key] - before[key]
        return None

    dev = delta("device_sectors")
    srv = delta("server_write")
    ticks = delta("server_ticks")
    hz = os.sysconf("SC_CLK_TCK")
    mib = 2**20
    print(json.dumps({
        "target": target, "rep": int(rep), "step": int(stepno), "job": job,
        "iops": ios / seconds if seconds else 0, "mibs": sum(bytes_rw.values()) / mib / seconds if seconds else 0,
        "seconds": seconds, "p50": lat["p50"], "p99": lat["p99"], "p999": lat["p999"],
        "max": max(maxima.values()), "sync_p50": percentile(sync_bins, 50) if sync_bins else None,
        "curve": curve, "spark": spark, "worst_window": worst,
        "client_written_mib": client_written / mib,
        "wa_server": round(srv / client_written, 3) if srv is not None and client_written else None,
        "wa_device": round(dev * 512 / client_written, 3) if dev is not None and client_written else None,
        "server_cpu": ticks / hz / wall * 100 if ticks is not None else None,
        "file_dirty_mib": after.get("file_dirty_pages", 0) * 4096 / mib,
        "file_writeback_mib": after.get("file_writeback_pages", 0) * 4096 / mib,
        "file_cached_mib": after.get("file_cached_pages", 0) * 4096 / mib,
        "dirty_mib": after.get("dirty_kib", 0) / 1024, "writeback_mib": after.get("writeback_kib", 0) / 1024,
    }))


def table(argv):
    rows = [json.loads(l) for l in open(argv[0]) if l.strip()]
    out = argv[1]
    E = os.environ
    targets = E["B_TARGETS"].split()
    seq = E["B_SEQUENCE"].split()
    agg = {}
    for r in rows:
        agg.setdefault((r["target"], r["step"]), []).append(r)

    def med(t, s, k):
        xs = [r[k] for r in agg.get((t, s), []) if r.get(k) is not None]
        return statistics.median(xs) if xs else None

    def ratio(t, base, s, k):
        # Issue 24 asks for medians of ratios each measured in one run:
        # run i of a target against run i of the baseline (they ran
        # back to back), then the median of those ratios.
        bs = {r["rep"]: r[k] for r in agg.get((base, s), []) if r.get(k)}
        xs = [r[k] / bs[r["rep"]] for r in agg.get((t, s), []) if r.get(k) and r["rep"] in bs]
        return statistics.median(xs) if xs else None

    def rep_row(t, s):
        # The run whose IOPS is the median: its curve is the one shown.
        rs = sorted(agg.get((t, s), []), key=lambda r: r["iops"])
        return rs[len(rs) // 2] if rs else None

    def f(x, fmt="%.0f"):
        return "-" if x is None else fmt % x

    def git(*a):
        try:
            return subprocess.check_output(["git", "-C", E["B_REPO"], *a], text=True).strip()
        except Exception:
            return "?"
    cpu = "?"
    for l in open("/proc/cpuinfo"):
        if l.startswith("model name"):
            cpu = l.split(":", 1)[1].strip()
            break
    title = "three replicas on three nodes of this machine" if "trireme3" in targets else "one volume"
    L = [f"## Steady state (issue 24): {title}, the jobs in sequence, no sync between them\n"]
    L.append(f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
    L.append(f"- command: `{E['B_CMD']}`")
    dirty = int(E.get("B_DIRTY", "0") or 0)
    L.append(f"- trireme: {git('rev-parse', '--short', 'HEAD')} ({git('log', '-1', '--format=%s')}), release build"
             + (f", working tree with {dirty} uncommitted changed files" if dirty else ""))
    L.append(f"- machine: {os.cpu_count()} CPUs ({cpu}), {round(os.sysconf('SC_PAGE_SIZE')*os.sysconf('SC_PHYS_PAGES')/2**30)} GiB RAM, kernel {platform.release()}; disk: {E['B_DISK']}")
    L.append(f"- {E['B_LOAD']}. " + (E.get("B_LOAD_NOTE") or "nothing else was meant to run on the machine; the ratios against qemu-direct, measured in the same run, are what count"))
    L.append(f"- sequence, on one {E['B_SIZE']} volume prefilled with 1 MiB sequential writes, then the steps below in order with no `sync` and no cache drop: write jobs at least {E['B_WRITE_MIN']} s and until they have written {E['B_VOLUMES']}× the volume (at most {E['B_WRITE_MAX']} s; J1 time only: see *written MiB*), read jobs {E['B_READ_TIME']} s; {E['B_REPEAT']} whole sequence(s) per target (medians)")
    L.append("- **qemu-direct** (the baseline) = `qemu-nbd -f raw --cache=none --aio=native -e 16` on a preallocated raw file; **raw** = fio libaio `--direct=1` on a preallocated file; **trireme** = `trireme node run`, a volume on a sparse file-backed pool, checksums on; **trireme3** = three `trireme node run` on 127.0.0.1, each with a sparse file-backed pool on the same disk, a volume with three replicas attached on n1 (WA, CPU and file pages summed over the three); all fio `--ioengine=nbd` except raw")
    L.append("- latency = fio completion latency in µs from all I/Os of the job (json+ bins), the worse of read/write; J1 cycle = 1e6 / IOPS (a 4k write and its flush)")
    L.append("- IOPS per 10 s: fio's averaged IOPS log, one character per 10 s window, scaled to the job's best window; worst/median = the lowest full window after the first over the median window (target ≥ 0.7)")
    L.append("- WA server = the server's `/proc/PID/io` write_bytes ÷ bytes fio wrote: exact for direct I/O (qemu-direct), but **meaningless for a server that writes through the page cache on this kernel**: a page-cache folio is counted whole when it turns dirty, and ext4 caches large folios since Linux 6.16, so a 4 KiB write into a cached 2 MiB folio counts 2 MiB; WA disk = sectors written to the whole disk (/proc/diskstats) ÷ bytes fio wrote: includes everyone else's writes (builds, tests), so it is an upper bound here")
    L.append("- file dirty / wb = the data file's pages dirty / under write-back in the page cache at the job's end (cachestat(2)): the server's own data; Dirty / Writeback = /proc/meminfo at the end, the whole machine\n")
    for t in targets:
        L.append(f"### {t}\n")
        L.append("| step | job | what | IOPS | MiB/s | p99 µs | p99.9 µs | max µs | J1 cycle µs | IOPS per 10 s | worst/median | written MiB | WA server | WA disk | file dirty / wb MiB | Dirty / Writeback MiB | server CPU % |")
        L.append("|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for s, j in enumerate(seq, 1):
            r = rep_row(t, s)
            if not r:
                continue
            iops = med(t, s, "iops")
            L.append(f"| {s} | {j} | {DESC[j]} | {f(iops)} | {f(med(t,s,'mibs'),'%.1f')} | {f(med(t,s,'p99'))} | {f(med(t,s,'p999'))} | {f(med(t,s,'max'))} | "
                     f"{f(1e6/iops if j == 'J1' and iops else None,'%.1f')} | `{r['spark']}` | {f(med(t,s,'worst_window'),'%.2f')} | "
                     f"{f(med(t,s,'client_written_mib'))} | {f(med(t,s,'wa_server'),'%.2f') if j in WRITE_JOBS else '-'} | {f(med(t,s,'wa_device'),'%.2f') if j in WRITE_JOBS else '-'} | "
                     f"{f(med(t,s,'file_dirty_mib'))} / {f(med(t,s,'file_writeback_mib'))} | {f(med(t,s,'dirty_mib'))} / {f(med(t,s,'writeback_mib'))} | {f(med(t,s,'server_cpu'))} |")
        L.append("")
    if "trireme" in targets and "qemu-direct" in targets:
        L.append("### trireme / qemu-direct, and the issue's targets (item 5, single node)\n")
        L.append("Each ratio is the median of the runs' own ratios (run i of trireme against run i of qemu-direct, measured back to back), as the issue asks.\n")
        L.append("| step | job | IOPS ratio | p99.9 ratio | J1 cycle ratio | target | met |")
        L.append("|---:|---|---:|---:|---:|---|---|")
        for s, j in enumerate(seq, 1):
            r = ratio("trireme", "qemu-direct", s, "iops")
            pr = ratio("trireme", "qemu-direct", s, "p999")
            cr = 1 / r if j == "J1" and r else None
            if j in ("J2", "J4"):
                tgt, ok = "IOPS ≥ 0.8×, p99.9 ≤ 5×", r is not None and r >= 0.8 and pr is not None and pr <= 5
            elif j == "J5":
                tgt, ok = "IOPS ≥ 0.9×", r is not None and r >= 0.9
            elif j == "J1":
                tgt, ok = "cycle ≤ 1.15×", cr is not None and cr <= 1.15
            else:
                tgt, ok = "IOPS ≥ 1.0×", r is not None and r >= 1.0
            L.append(f"| {s} | {j} | {f(r,'%.2f')} | {f(pr,'%.2f')} | {f(cr,'%.2f')} | {tgt} | {'yes' if ok else '**no**'} |")
        worst = [(s, med('trireme', s, 'worst_window')) for s in range(1, len(seq) + 1)]
        worst = [(s, w) for s, w in worst if w is not None]
        if worst:
            s, w = min(worst, key=lambda x: x[1])
            L.append(f"\nIOPS curves: trireme's lowest 10 s window after the first, over its job's median, is {w:.2f} (step {s}); target ≥ 0.7: {'met' if w >= 0.7 else '**not met**'}.\n")
    if "trireme3" in targets and "qemu-direct" in targets:
        L.append("### trireme3 (three replicas) / qemu-direct (one unreplicated copy), and the issue's targets (item 5, three replicas)\n")
        L.append("Every replicated write costs three device writes on this one disk (the three nodes' pools share it), qemu-direct's one.\n")
        L.append("| step | job | IOPS ratio | p99.9 ratio | J1 cycle ratio | target | met |")
        L.append("|---:|---|---:|---:|---:|---|---|")
        for s, j in enumerate(seq, 1):
            r = ratio("trireme3", "qemu-direct", s, "iops")
            pr = ratio("trireme3", "qemu-direct", s, "p999")
            cr = 1 / r if j == "J1" and r else None
            if j == "J2":
                tgt, ok = "IOPS ≥ 0.33×", "yes" if r is not None and r >= 0.33 else "**no**"
            elif j == "J1":
                tgt, ok = "cycle ≤ 1.15× the chain of `bench/replicated.sh` (context here: qemu-direct's cycle)", "-"
            else:
                tgt, ok = "(context)", "-"
            L.append(f"| {s} | {j} | {f(r,'%.2f')} | {f(pr,'%.2f')} | {f(cr,'%.2f')} | {tgt} | {ok} |")
        worst = [(s, med('trireme3', s, 'worst_window')) for s in range(1, len(seq) + 1)]
        worst = [(s, w) for s, w in worst if w is not None]
        if worst:
            s, w = min(worst, key=lambda x: x[1])
            L.append(f"\nIOPS curves: trireme3's lowest 10 s window after the first, over its job's median, is {w:.2f} (step {s}); target ≥ 0.7: {'met' if w >= 0.7 else '**not met**'}.\n")
    mark = E.get("B_MARK", "steady")
    begin, end = f"<!-- {mark}:begin -->", f"<!-- {mark}:end -->"
    block = begin + "\n" + "\n".join(L) + "\n" + end
    text = open(out).read() if os.path.exists(out) else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    open(out, "w").write(text)
    print("\n".join(L))


if __name__ == "__main__":
    {"step": step, "table": table}[sys.argv[1]](sys.argv[2:])
