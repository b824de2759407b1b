#!/usr/bin/env python3
"""Reads the output of `cargo test --workspace` (stdout and stderr together) and
prints how long each test binary took, slowest first, with its test count.

It fails (exit 1) when no test ran at all, or when an integration-test binary
(a file under some crate's tests/) ran none: a filter that matches nothing, or a
test file whose tests were all compiled out, must not pass as green.

Usage: cargo test --workspace 2>&1 | tee LOG; python3 .ci/test_times.py LOG
"""
import re
import sys

RUNNING = re.compile(r"^\s+Running (.+?) \(([^)]+)\)\s*$")
DOCTESTS = re.compile(r"^\s+Doc-tests (\S+)")
RESULT = re.compile(
    r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored;.* finished in ([0-9.]+)s"
)


def binary_name(source, path, package):
    """`tests/crash.rs` or `unittests src/lib.rs` -> a readable name. Cargo
    names no package for an integration test: it follows its package's unit
    tests, whose binary is named after the crate."""
    crate = re.sub(r"-[0-9a-f]{16}$", "", path.rsplit("/", 1)[-1])
    if source.startswith("unittests"):
        return f"{crate} (unit {source.split()[-1]})", crate
    return f"{package}: {source}", package


def parse(lines):
    rows = []
    current = None
    package = "?"
    for line in lines:
        running = RUNNING.match(line)
        if running:
            source, path = running.group(1), running.group(2)
            name, package = binary_name(source, path, package)
            current = (name, source.startswith("tests/"))
            continue
        doc = DOCTESTS.match(line)
        if doc:
            current = (f"{doc.group(1)} (doc)", False)
            continue
        result = RESULT.match(line)
        if result and current:
            name, integration = current
            rows.append(
                {
                    "name": name,
                    "integration": integration,
                    "ok": result.group(1) == "ok",
                    "passed": int(result.group(2)),
                    "failed": int(result.group(3)),
                    "seconds": float(result.group(5)),
                }
            )
            current = None
    return rows


def main():
    with open(sys.argv[1], encoding="utf-8", errors="replace") as log:
        rows = parse(log)
    rows.sort(key=lambda row: row["seconds"], reverse=True)
    total = sum(row["seconds"] for row in rows)
    print(f"{'seconds':>8}  {'tests':>5}  test binary")
    for row in rows:
        mark = "" if row["ok"] else "  FAILED"
        print(f"{row['seconds']:8.1f}  {row['passed']:5}  {row['name']}{mark}")
    print(f"{total:8.1f}  {sum(r['passed'] for r in rows):5}  all {len(rows)} binaries (time inside the binaries)")
    empty = [row["name"] for row in rows if row["integration"] and row["passed"] == 0]
    if not rows or sum(row["passed"] for row in rows) == 0:
        print("error: no test ran", file=sys.stderr)
        return 1
    if empty:
        print(f"error: these test files ran no test: {', '.join(empty)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
