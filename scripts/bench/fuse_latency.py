#!/usr/bin/env python3
"""Each FUSE request type's time from the kernel's send to the mount's reply.

Reads `perf script -F time,event,trace` of the `fuse:fuse_request_send` and
`fuse:fuse_request_end` tracepoints (scripts/profile-small.sh records them) and prints,
per request type: how many per file, the mean, median and 99th percentile from send to
reply, and the time per file. Then the span from the first send to the last reply, and
how much of it no request covered: the program, its system calls and the kernel's own
work between requests (what a faster mount cannot take away).

    fuse_latency.py TRACE FILES [CONNECTION]

CONNECTION (the mount's device minor number, `mountpoint -d` prints 0:N) keeps only that
mount's requests: the tracepoints see every FUSE mount of the machine.
"""
import collections
import re
import sys

SEND = re.compile(
    r"^\s*([0-9.]+):\s+fuse:fuse_request_send:\s+connection (\d+) req (\d+) "
    r"opcode \d+ \((\w+)\)"
)
END = re.compile(r"^\s*([0-9.]+):\s+fuse:fuse_request_end:\s+connection (\d+) req (\d+) ")


def percentile(sorted_values, q):
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return sorted_values[i]


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: fuse_latency.py TRACE FILES [CONNECTION]")
    path, files = sys.argv[1], int(sys.argv[2])
    only = sys.argv[3] if len(sys.argv) == 4 else None
    sent = {}  # (connection, unique) -> (time, opcode)
    times = collections.defaultdict(list)  # opcode -> [seconds]
    counts = collections.Counter()  # every send, replied or not (FORGET never is)
    intervals = []
    for line in open(path, errors="replace"):
        m = SEND.match(line)
        if m:
            t, conn, unique, op = float(m.group(1)), m.group(2), m.group(3), m.group(4)
            if only is not None and conn != only:
                continue
            sent[(conn, unique)] = (t, op)
            counts[op] += 1
            continue
        m = END.match(line)
        if m:
            t, key = float(m.group(1)), (m.group(2), m.group(3))
            start = sent.pop(key, None)
            if start is not None:
                times[start[1]].append(t - start[0])
                intervals.append((start[0], t))
    if not counts:
        print("    (no FUSE requests recorded)")
        return
    print("| request | per file | mean us | median us | 99th us | us per file |")
    print("| --- | --- | --- | --- | --- | --- |")
    for op, n in counts.most_common():
        v = sorted(times.get(op, []))
        if v:
            mean = sum(v) / len(v) * 1e6
            row = (
                f"{mean:,.0f} | {percentile(v, 0.5) * 1e6:,.0f} | "
                f"{percentile(v, 0.99) * 1e6:,.0f} | {sum(v) / files * 1e6:,.0f}"
            )
        else:
            row = "no reply | | | "
        print(f"| {op} | {n / files:.2f} | {row} |")
    if not intervals:
        return
    intervals.sort()
    covered, (lo, hi) = 0.0, intervals[0]
    for s, e in intervals[1:]:
        if s > hi:
            covered += hi - lo
            lo, hi = s, e
        else:
            hi = max(hi, e)
    covered += hi - lo
    span = max(e for _, e in intervals) - intervals[0][0]
    print()
    print(
        f"First send to last reply: {span / files * 1e6:,.0f} us per file; inside a "
        f"request {covered / files * 1e6:,.0f}, outside every request "
        f"{(span - covered) / files * 1e6:,.0f} (the program, its system calls, the VFS)."
    )


if __name__ == "__main__":
    main()
