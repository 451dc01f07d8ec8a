#!/usr/bin/env python3
"""Summarizes a bench/kernel_trace.c timeline (CSV) of one gpu_bench run.

The trace splits into evals at the device-to-host copies that end each
lmx_context_eval. For the eager evals of the most kernel time (prefill) and
for the replayed decode steps (kernels from a CUDA graph), it prints per
kernel: launches, mean duration, and the time it adds to the step (its end
minus the previous kernel's end: with programmatic dependent launch kernels
overlap, so the sum of those, not of durations, is the step).

    bench/kernel_trace.py trace.csv [--prefill N] [--steps N]
"""
import argparse
import collections
import re


def short(name):
    """A readable kernel name: lmx's k_* with its template arguments, or the
    first words of a library kernel's name."""
    m = re.search(r"(k_[a-z0-9_]+)", name)
    if not m:
        return name[:48]
    tmpl = re.search(r"k_[a-z0-9_]+I(.*?)EEv", name)
    args = ""
    if tmpl:
        t = tmpl.group(1)
        fmt = re.search(r"fmt_(float|quant)I(\w+?)E", t)
        if fmt:
            args += fmt.group(1) + ("<" + fmt.group(2).replace("13__nv_bfloat16", "bf16").replace("6__half", "f16") + ">")
        nums = re.findall(r"Li(\d+)E", t)
        bools = re.findall(r"Lb([01])E", t)
        args += "".join("," + n for n in nums) + ("".join(",gated" for b in bools if b == "1"))
    return m.group(1) + ("<" + args.lstrip(",") + ">" if args else "")


def load(path):
    """The GPU's records cut into evals, and the host's runtime calls
    (start, end, name), both in time order."""
    rows, calls = [], []
    with open(path) as f:
        for line in f:
            kind, start, end, graph, grid, block, name = line.rstrip("\n").split(",", 6)
            if kind == "R":
                calls.append((int(start), int(end), name))
            else:
                rows.append((int(start), int(end), kind, int(graph), int(grid), int(block), name))
    rows.sort()
    calls.sort()
    evals, cur = [], []
    for r in rows:
        cur.append(r)
        if r[2] == "M" and r[6].startswith("DtoH"):
            evals.append(cur)
            cur = []
    return evals, calls


def host_turn(steps, prev_ends, calls):
    """The host's turn between steps: per runtime call made from the end of
    the previous step's last copy to the end of this step, calls a step,
    mean start after that copy, mean duration; and when the step's first
    kernel started."""
    stats = collections.OrderedDict()
    first = 0.0
    for step, t0 in zip(steps, prev_ends):
        first += next(r[0] for r in step if r[2] == "K") - t0
        seen = set()
        for start, end, name in calls:
            if t0 <= start < step[-1][1]:
                s = stats.setdefault(name, [0, 0.0, 0.0])
                s[0] += 1
                s[2] += end - start
                if name not in seen:
                    s[1] += start - t0
                    seen.add(name)
    n = len(steps)
    print(f"host turn: the first kernel starts {first / n / 1e3:.1f} us after the previous step's last copy")
    print(f"{'runtime call':44} {'/step':>6} {'starts at us':>12} {'mean us':>8}")
    for name, (cnt, at, dur) in sorted(stats.items(), key=lambda kv: kv[1][1]):
        print(f"{name:44} {cnt / n:6.1f} {at / n / 1e3:12.1f} {dur / cnt / 1e3:8.2f}")


def table(title, steps):
    """Per kernel name over `steps` (lists of rows): launches a step, mean
    duration, mean time added to the step."""
    stats = collections.OrderedDict()
    span = 0.0
    for step in steps:
        prev_end = step[0][0]
        span += step[-1][1] - step[0][0]
        for start, end, kind, _, grid, block, name in step:
            key = short(name) if kind == "K" else name.split(" ")[0]
            s = stats.setdefault(key, [0, 0.0, 0.0, grid, block])
            s[0] += 1
            s[1] += end - start
            s[2] += max(end - prev_end, 0)
            prev_end = max(prev_end, end)
    n = len(steps)
    print(f"\n{title}: {n} evals, mean span {span / n / 1e3:.1f} us")
    print(f"{'kernel':44} {'grid':>7} {'block':>5} {'/step':>6} {'mean us':>8} {'added us/step':>14} {'share':>6}")
    for key, (cnt, dur, added, grid, block) in sorted(stats.items(), key=lambda kv: -kv[1][2]):
        print(f"{key:44} {grid:7d} {block:5d} {cnt / n:6.1f} {dur / cnt / 1e3:8.2f} {added / n / 1e3:14.1f} "
              f"{100 * added / span:5.1f}%")


def host_calls(calls):
    """Per runtime call: count, median and mean duration."""
    by = collections.defaultdict(list)
    for start, end, name in calls:
        by[name].append(end - start)
    print(f"{'runtime call':44} {'calls':>7} {'median us':>10} {'mean us':>8}")
    for name, d in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        d.sort()
        print(f"{name:44} {len(d):7d} {d[len(d) // 2] / 1e3:10.2f} {sum(d) / len(d) / 1e3:8.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--prefill", type=int, default=1, help="eager evals (prefill) of the most kernel time to show")
    ap.add_argument("--steps", type=int, default=32, help="last replayed steps of each kind to average")
    a = ap.parse_args()
    evals, ends = [], []  # ends: where the eval before each ended
    loaded, calls = load(a.trace)
    if not loaded:  # LMX_TRACE_HOST=1: the runtime calls alone
        host_calls(calls)
        return
    for i, e in enumerate(loaded):  # from the eval's last upload (its token ids) on: not the model's load
        ups = [k for k, r in enumerate(e) if r[2] == "M" and r[6].startswith("HtoD")]
        e = e[ups[-1]:] if ups else e
        if any(r[2] == "K" for r in e):
            evals.append(e)
            ends.append(loaded[i - 1][-1][1] if i else e[0][0])
    eager = [e for e in evals if not any(r[3] for r in e)]
    # by kernel time, not span: a cold eval's span is mostly the host's first-use gaps
    for e in sorted(eager, key=lambda e: -sum(r[1] - r[0] for r in e if r[2] == "K"))[: a.prefill]:
        table(f"eager eval of {sum(r[2] == 'K' for r in e)} kernels", [e])
    runs = []  # consecutive replayed steps of one size: one decode run (indices into evals)
    for i, e in enumerate(evals):
        graphed = any(r[3] for r in e)
        if graphed and runs and runs[-1] is not None and len(evals[runs[-1][-1]]) == len(e):
            runs[-1].append(i)
        else:
            runs.append([i] if graphed else None)
    for run in filter(None, runs):
        run = run[-a.steps:]
        steps = [evals[i] for i in run]
        table(f"replayed steps of {len(steps[0])} records", steps)
        if calls:
            host_turn(steps, [ends[i] for i in run], calls)


if __name__ == "__main__":
    main()
