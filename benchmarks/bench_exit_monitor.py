"""The gate-collapse monitor's overhead, side by side: one ``loop-convert`` training step
(per-step LM heads, exit gate, smoothed exit loss, backward, AdamW) with the monitor's
per-step work (the exit distribution summed in the loss, read to the host, recorded and
checked by :class:`loopeval.training.exit_monitor.CollapseMonitor`) and without it, interleaved
step by step in one process; plus the monitor's own work timed alone.

    python benchmarks/bench_exit_monitor.py --steps 40 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit

from train_model import add_model_args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per variant")
    add_model_args(parser)
    args = parser.parse_args()

    import torch

    from loopeval import apply_loop
    from loopeval.core.exit_gate import exit_loss_sums
    from loopeval.training.exit_monitor import CollapseMonitor
    from loopeval.core.spec import LoopConfig
    from loopeval.tools.tiny import tiny_model
    from loopeval.training.loop_convert import LoopConvertModel

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    spec = f"0:{args.layers}x3"
    model = apply_loop(tiny_model("qwen3", vocab_size=args.vocab, num_layers=args.layers, hidden=args.hidden),
                       LoopConfig(spec, mix=4.6, mix_source="embedding"))
    module = LoopConvertModel(model, mix_init=4.6, seed=0).train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-5)
    ids = torch.randint(3, args.vocab, (args.batch, args.length))
    n = args.batch * (args.length - 1)
    monitor, record = CollapseMonitor(), []

    def step(i: int, monitored: bool) -> float:
        t0 = time.perf_counter()
        out = module(ids, labels=ids)
        sums = exit_loss_sums(out["step_nll"], out["halt"], beta=0.15, smoothing=0.05)
        (sums["loss"] / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if monitored:
            p = (sums["p"] / n).tolist()
            record.append(p)
            monitor.update(i, p[0])
        else:
            sums["loss"].item()  # the step loop reads its loss either way
        return time.perf_counter() - t0

    for i in range(2):  # warm-up
        step(i, True)
    times = {True: [], False: []}
    for i in range(args.steps):
        for monitored in ((True, False) if i % 2 == 0 else (False, True)):
            times[monitored].append(step(i, monitored))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    p = torch.full((3,), 0.3 * n)
    alone = min(timeit.repeat(lambda: monitor.update(0, (p / n).tolist()[0]), number=2000, repeat=5)) / 2000
    print(f"loop {spec}, hidden {args.hidden}, vocabulary {args.vocab}, batch {args.batch} x {args.length} tokens, "
          f"{args.threads} thread(s), {args.steps} steps per variant (median)")
    print(f"| variant | step time |\n|---|---|\n| with the monitor | {on:.3f} s |\n| without | {off:.3f} s |")
    print(f"ratio with / without: {on / off:.3f}; the monitor's own work: {alone * 1e6:.1f} us per step "
          f"({alone / off:.1e} of a step)")


if __name__ == "__main__":
    main()
