"""``loopeval place`` with prefix reuse against the naive full-forward search, side by side.

The full default grid (widths 2-8, K in {2,3,4}, damped with beta in {0, 0.25, 0.5}:
756 candidates) on a 16-layer random Qwen3 on CPU, scored by both engines on the same
text, in one run, interleaved (naive, prefix, prefix, naive, ...; the best of the
repeats): wall and CPU time, layer passes executed (per text position) against the
analytic count, and the two ratios. Then a projection for Qwen3-8B's 2,016-configuration
grid (see docs/benchmarks.md for the assumption).

    python benchmarks/bench_place.py [--threads 2] [--repeats 2] [--hidden 128] [--tokens 1024]

``--real CHECKPOINT --data TEXT.jsonl`` measures a real model instead: a grid of
``--widths``/``--times``/``--betas`` (every start) scored by ``place`` on ``--tokens``
tokens of ``--seq-len``, and, side by side in the same run (before and after, the faster
kept), a plain forward of the same rows: the decoder's layers (time per layer pass) and
the LM head over the same positions. The ratio is the search's wall time over the time
of the layer passes it executed in a plain forward (issue 26: at most 1.5); the second
ratio also charges the plain forwards one LM head per candidate.

    python benchmarks/bench_place.py --real smollm2 --data gsm8k_text.jsonl --tokens 2048 \
        --seq-len 1024 --batch-tokens 2048 --widths 4 --times 2,3 --betas 0,0.25 --starts 8,12,16,20 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

from loopeval.core.cost import loop_cost
from loopeval.tools.placement import build_grid, place, planned_passes
from loopeval.tools.tiny import tiny_model, tiny_tokenizer

WORDS = ("the quick brown fox jumps over a lazy dog and then reads five pages a day for six days so how many "
         "pages does she read in all please reason step by step put your final answer in a box").split()


def write_text(path: Path, tokens: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 120))) for _ in range(tokens // 40)]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))


def qwen3_8b_config():
    """Qwen3-8B's published shape (no weights are needed to count its FLOPs)."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)


def _plain_forward(model, text, batch_tokens: int, *, cpu: bool = False) -> tuple[float, float]:
    """Seconds (wall, or CPU with ``cpu``) for the decoder's layers on every row of ``text``
    (val and test, in place's batches) and for the LM head on their scored positions."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    rows = torch.cat([text.val.ids, text.test.ids])
    labels = torch.cat([text.val.labels, text.test.labels])
    per = max(1, batch_tokens // rows.shape[1])
    layers = head = 0.0
    clock = time.process_time if cpu else time.perf_counter
    with torch.no_grad():
        for i in range(0, rows.shape[0], per):
            t = clock()
            h = decoder(input_ids=rows[i:i + per], use_cache=False).last_hidden_state
            layers += clock() - t
            t = clock()
            model.get_output_embeddings()(h[:, :-1][labels[i:i + per, 1:] != -100])
            head += clock() - t
    return layers, head


def _ints(text: str) -> list[int]:
    """``"2,4"`` or ``"2-8"``."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def real(args) -> None:
    from loopeval.core.checkpoint import load_model
    from loopeval.core.loop import count_layers
    from loopeval.tools.placement import search
    from loopeval.tools.placement.text import load_text

    model, tokenizer = load_model(args.real)
    model.eval()
    n = count_layers(model)
    widths, times, starts = _ints(args.widths), _ints(args.times), _ints(args.starts) if args.starts else None
    betas = [float(b) for b in args.betas.split(",")]
    grid = build_grid(n, widths=widths, times=times, betas=betas, starts=starts)
    text = load_text(args.data, tokenizer, seq_len=args.seq_len, max_tokens=args.tokens)
    forward = [_plain_forward(model, text, args.batch_tokens)]
    forward_cpu = [_plain_forward(model, text, args.batch_tokens, cpu=True)]
    work = Path(tempfile.mkdtemp(prefix="bench_place_real_"))
    if args.refit_head:  # the search before issue 26: the LM head re-applied at every Newton step of a fit
        search.FIT_LOGITS_MEMORY = 0
    start, start_cpu = time.perf_counter(), time.process_time()
    result = place(model, args.data, out=work / "out", tokenizer=tokenizer, widths=widths, times=times, betas=betas,
                   starts=starts,
                   seq_len=args.seq_len, max_tokens=args.tokens, batch_tokens=args.batch_tokens, progress=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    forward.append(_plain_forward(model, text, args.batch_tokens))
    forward_cpu.append(_plain_forward(model, text, args.batch_tokens, cpu=True))
    layers_cpu, head_cpu = min(f[0] for f in forward_cpu), min(f[1] for f in forward_cpu)
    layers, head = min(f[0] for f in forward), min(f[1] for f in forward)
    per_pass = layers / n
    passes = result.layer_passes
    print(f"{args.real}: {n} layers, {len(grid)} candidates, {result.text['rows']} rows x {args.seq_len} tokens "
          f"({result.text['val_tokens']} validation, {result.text['test_tokens']} test), "
          f"{torch.get_num_threads()} threads, load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"plain forward of the same rows: {layers:.2f} s for {n} layers ({per_pass * 1000:.0f} ms per layer pass), "
          f"LM head {head:.2f} s ({head / per_pass:.1f} layer passes)")
    print(f"search: {wall:.1f} s, {wall / (len(grid) + 1):.2f} s per candidate; {passes:.1f} layer passes per text "
          f"position executed ({passes / (len(grid) + 1):.1f} per candidate, the unlooped one included)")
    print(f"search / its layer passes in a plain forward: {wall / (passes * per_pass):.2f}; with one LM head per "
          f"candidate: {wall / (passes * per_pass + (len(grid) + 1) * head):.2f}")
    print(f"the same in CPU time (less sensitive to load; one thread): search {cpu:.1f} s, a layer pass "
          f"{layers_cpu / n * 1000:.0f} ms, LM head {head_cpu:.2f} s: {cpu / (passes * layers_cpu / n):.2f}; with one LM "
          f"head per candidate: {cpu / (passes * layers_cpu / n + (len(grid) + 1) * head_cpu):.2f}")
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", help="a real unlooped checkpoint folder (see the docstring)")
    parser.add_argument("--data", help="with --real: JSONL of {\"text\"} documents")
    parser.add_argument("--times", default="2,3,4")
    parser.add_argument("--betas", default="0,0.25,0.5")
    parser.add_argument("--starts", help="with --real: window starts, e.g. 8,12,16 (default: every layer)")
    parser.add_argument("--refit-head", action="store_true",
                        help="with --real: apply the LM head at every Newton step of each fit, as before issue 26")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=1024, help="text tokens, validation and test together")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--widths", default="2-8")
    parser.add_argument("--gpu-tflops", type=float, default=400.0,
                        help="assumed sustained bf16 throughput of one GPU for the projection")
    parser.add_argument("--project-tokens", type=int, default=65536)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.real:
        real(args)
        return
    lo, _, hi = args.widths.partition("-")
    widths = list(range(int(lo), int(hi or lo) + 1))

    tokenizer = tiny_tokenizer()
    model = tiny_model("qwen3", vocab_size=len(tokenizer), num_layers=args.layers, hidden=args.hidden)
    work = Path(tempfile.mkdtemp(prefix="bench_place_"))
    data = work / "text.jsonl"
    write_text(data, args.tokens)
    options = dict(tokenizer=tokenizer, widths=widths, seq_len=args.seq_len, batch_tokens=args.batch_tokens,
                   max_tokens=args.tokens, progress=False)
    grid = build_grid(args.layers, widths=widths)
    engines = {"naive": False, "prefix reuse": True}
    results, wall, cpu = {}, {n: [] for n in engines}, {n: [] for n in engines}
    for i in range(args.repeats):
        for name in (engines if i % 2 == 0 else reversed(engines)):
            shutil.rmtree(work / "out", ignore_errors=True)
            w, c = time.perf_counter(), time.process_time()
            results[name] = place(model, data, out=work / "out", reuse=engines[name], **options)
            wall[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    rows = results["naive"].text["rows"]
    text_tokens = rows * args.seq_len
    print(f"{args.layers}-layer Qwen3 (hidden {args.hidden}, vocabulary {len(tokenizer)}), {len(grid)} candidates, "
          f"{rows} rows x {args.seq_len} tokens, {args.threads} threads, best of {args.repeats}")
    print(f"{'engine':<14}{'wall':>9}{'CPU':>9}{'passes run':>12}{'planned':>10}{'token-layers/s':>16}")
    for name, result in results.items():
        planned = planned_passes(grid, args.layers, reuse=engines[name], text_rows=rows)
        rate = result.layer_passes * text_tokens / min(wall[name])
        print(f"{name:<14}{min(wall[name]):>8.1f}s{min(cpu[name]):>8.1f}s{result.layer_passes:>12.1f}{planned:>10.1f}"
              f"{rate:>16.3g}")
    naive, fast = results["naive"], results["prefix reuse"]
    floor = (args.layers + sum((args.layers - c.start) + c.spec.extra_passes for c in grid)) / naive.layer_passes
    same = max(abs(a.ppl_t / b.ppl_t - 1) for a, b in zip(fast.rows, naive.rows))
    evaluations = fast.fit_evaluations / (len(fast.rows))
    print(f"temperature fits: {evaluations:.1f} passes over the validation logits per candidate (Newton)")
    print(f"prefix / naive: layer passes {fast.layer_passes / naive.layer_passes:.3f} (prefix reuse alone: "
          f"{floor:.3f}); wall {min(wall['prefix reuse']) / min(wall['naive']):.3f}, CPU "
          f"{min(cpu['prefix reuse']) / min(cpu['naive']):.3f}; largest PPL_T difference {same:.1e} (relative)")

    cfg = qwen3_8b_config()
    big = build_grid(36)
    cost = loop_cost(cfg, None)
    layer_flops = (cost.base_flops_per_token(args.seq_len / 2) - 2 * cost.head_params) / 36
    head_flops = 2 * cost.head_params
    passes = planned_passes(big, 36, text_rows=args.project_tokens // 2048)
    flops = args.project_tokens * (passes * layer_flops + (len(big) + 1) * head_flops)
    print(f"Qwen3-8B: {len(big)} configurations, {passes:.0f} layer passes per text position (naive "
          f"{planned_passes(big, 36, reuse=False):.0f}); {layer_flops / 1e9:.2f} GFLOP per token-layer, "
          f"{head_flops / 1e9:.2f} GFLOP per token for the LM head")
    print(f"projected for {args.project_tokens} text tokens at {args.gpu_tflops:g} TFLOP/s sustained: "
          f"{flops / (args.gpu_tflops * 1e12) / 60:.1f} min (naive: "
          f"{args.project_tokens * (planned_passes(big, 36, reuse=False) * layer_flops + (len(big) + 1) * head_flops) / (args.gpu_tflops * 1e12) / 60:.1f} min)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
