"""Time the cluster bootstrap and the resampled best-cheaper selection (issue 13).

    python benchmarks/bench_stats.py [--benchmarks 5] [--items 5000] [--clusters 500] [--unlooped 24]
                                     [--resamples 10000] [--repeats 5]

1. A macro over ``--benchmarks`` benchmarks of ``--items`` paired items, ``--resamples``
   resamples, with ``--clusters`` clusters per benchmark (items assigned at random, so
   sizes vary), next to the item bootstrap of the same data; 0/1 and real-valued scores.
2. ΔFLOP of one loop against ``--unlooped`` unlooped evaluations (0/1 scores on the
   same macro): building the shared resamples of all systems, then the comparator chosen
   once (``selection="fixed"``) and again in every resample (``"resampled"``).

Best of ``--repeats`` runs, with that run's CPU time over all threads (the machine is shared;
the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from loopeval.analysis.stats import Resampler, paired_bootstrap


def best_time(fn, repeats: int) -> str:
    """Best wall time of ``repeats`` runs, with that run's CPU time (all threads): the CPU time
    is what a run costs when it does not have to share the cores with other jobs."""
    runs = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        runs.append((time.perf_counter() - wall, time.process_time() - cpu))
    wall, cpu = min(runs)
    return f"{wall:.3f} s ({cpu:.3f} s CPU)"


def paired_scores(kind: str, benchmarks: int, items: int, rng: np.random.Generator):
    a, b = {}, {}
    for k in range(benchmarks):
        if kind == "0/1":
            base = (rng.random(items) < 0.4 + 0.1 * k).astype(float)
            a[f"bench{k}"], b[f"bench{k}"] = base, np.where(rng.random(items) < 0.15, 1 - base, base)
        else:  # e.g. NLL per text block
            base = rng.gamma(4, 0.6, items)
            a[f"bench{k}"], b[f"bench{k}"] = base, base + rng.normal(-0.01, 0.3, items)
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmarks", type=int, default=5)
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--clusters", type=int, default=500)
    parser.add_argument("--unlooped", type=int, default=24)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    print(f"machine: {cpu}, {len(os.sched_getaffinity(0))} cores usable; numpy {np.__version__}, "
          f"Python {platform.python_version()}; load average before: {os.getloadavg()[0]:.2f}")
    print(f"work: macro over {args.benchmarks} x {args.items} items, {args.resamples} resamples; "
          f"best of {args.repeats}\n")

    clusters = {f"bench{k}": rng.integers(0, args.clusters, args.items) for k in range(args.benchmarks)}
    print(f"| scores | items (paired_bootstrap) | {args.clusters} clusters per benchmark |")
    print("| --- | --- | --- |")
    for kind in ("0/1", "real-valued"):
        a, b = paired_scores(kind, args.benchmarks, args.items, rng)
        items = best_time(lambda: paired_bootstrap(a, b, n_resamples=args.resamples), args.repeats)
        clustered = best_time(lambda: paired_bootstrap(a, b, n_resamples=args.resamples, clusters=clusters),
                              args.repeats)
        print(f"| {kind} | {items} | {clustered} |")

    base = {f"bench{k}": (rng.random(args.items) < 0.4 + 0.1 * k).astype(float) for k in range(args.benchmarks)}
    systems = {name: {k: np.where(rng.random(args.items) < 0.15, 1 - v, v) for k, v in base.items()}
               for name in ["loop", *(f"unlooped{i}" for i in range(args.unlooped))]}
    costs = {f"unlooped{i}": 1.0 + 0.05 * i for i in range(args.unlooped)}
    loop_cost = max(costs.values())  # every unlooped evaluation is eligible
    build_s = best_time(lambda: Resampler(systems, n_resamples=args.resamples), args.repeats)
    rs = Resampler(systems, n_resamples=args.resamples)
    fixed_s = best_time(lambda: rs.best_cheaper_bootstrap("loop", costs, loop_cost), args.repeats)
    resampled_s = best_time(lambda: rs.best_cheaper_bootstrap("loop", costs, loop_cost, selection="resampled"),
                            args.repeats)
    total_s = best_time(lambda: Resampler(systems, n_resamples=args.resamples).best_cheaper_bootstrap(
        "loop", costs, loop_cost, selection="resampled"), args.repeats)
    print(f"\nΔFLOP, 1 loop + {args.unlooped} unlooped evaluations, all eligible, 0/1 scores:\n")
    print("| step | time |")
    print("| --- | --- |")
    print(f"| shared resamples of {1 + args.unlooped} systems (Resampler) | {build_s} |")
    print(f"| selection=\"fixed\" | {fixed_s} |")
    print(f"| selection=\"resampled\" | {resampled_s} |")
    print(f"| Resampler + resampled selection, end to end | {total_s} |")


if __name__ == "__main__":
    main()
