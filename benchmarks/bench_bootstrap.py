"""Time loopeval's paired bootstrap on a 5-benchmark macro against scipy.stats.bootstrap.

    python benchmarks/bench_bootstrap.py [--benchmarks 5] [--items 5000] [--resamples 10000] [--repeats 5]

Work: a macro over ``--benchmarks`` benchmarks of ``--items`` paired items each, with
``--resamples`` resamples per benchmark. scipy does the same per-benchmark work
(paired, vectorised, percentile interval), once per benchmark. Two kinds of scores:
0/1 accuracies (loopeval's multinomial shortcut) and real values (index resampling).
Prints a Markdown table and the machine; the best of ``--repeats`` runs counts for loopeval
(other processes on the machine add noise; the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import scipy
from scipy import stats

from loopeval.analysis.stats import paired_bootstrap


def scores(kind: str, benchmarks: int, items: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    a, b = {}, {}
    for k in range(benchmarks):
        if kind == "0/1":
            base = (rng.random(items) < 0.4 + 0.1 * k).astype(float)
            a[f"bench{k}"], b[f"bench{k}"] = base, np.where(rng.random(items) < 0.15, 1 - base, base)
        else:  # e.g. per-item NLL
            base = rng.gamma(4, 0.6, items)
            a[f"bench{k}"], b[f"bench{k}"] = base, base + rng.normal(-0.01, 0.3, items)
    return a, b


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def scipy_macro(a, b, resamples: int) -> None:
    for k in a:
        stats.bootstrap((a[k], b[k]), lambda x, y, axis: y.mean(axis) - x.mean(axis), paired=True,
                        vectorized=True, n_resamples=resamples, method="percentile", random_state=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmarks", type=int, default=5)
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    print(f"machine: {cpu}, {len(os.sched_getaffinity(0))} cores usable; "
          f"numpy {np.__version__}, scipy {scipy.__version__}, Python {platform.python_version()}")
    print(f"work: macro over {args.benchmarks} x {args.items} paired items, {args.resamples} resamples; "
          f"load average before: {os.getloadavg()[0]:.2f}\n")
    print("| scores | loopeval (best of %d) | scipy.stats.bootstrap | speed-up |" % args.repeats)
    print("| --- | --- | --- | --- |")
    for kind in ("0/1", "real-valued"):
        a, b = scores(kind, args.benchmarks, args.items)
        ours = best_time(lambda a=a, b=b: paired_bootstrap(a, b, n_resamples=args.resamples), args.repeats)
        theirs = best_time(lambda a=a, b=b: scipy_macro(a, b, args.resamples), 1)
        print(f"| {kind} | {ours:.3f} s | {theirs:.1f} s | {theirs / ours:.0f}x |")


if __name__ == "__main__":
    main()
