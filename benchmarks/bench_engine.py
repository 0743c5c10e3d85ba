"""lm-eval ``gsm8k_boxed`` on SmolLM2-135M: the HF path against the vLLM engine, looped and unlooped.

Runs in the engine's environment (README, "The vLLM engine"), one process, the four
evaluations one after another with the same items and budget, the HF path batched by
``--batch-size`` and the engine by ``--engine-batch-size`` (``auto``: every request at once,
as lm-eval's ``vllm`` model takes ``--batch_size auto``); each row is
the evaluation's wall time (the model already loaded), its generated tokens (from the
trace) and tokens/s, and start-up (loading) apart. Also checks that each engine run's
responses equal the HF path's.

    python benchmarks/bench_engine.py --model smollm2 --tasks-dir local_tasks --limit 64 --budget-scale 0.6667 --batch-size 16
    python benchmarks/bench_engine.py ... --engine-batch-size 16   # the engine batched as the HF path is
    python benchmarks/bench_engine.py --model smollm2 --tasks-dir local_tasks --interleave 5   # looped / unlooped only
    python benchmarks/bench_engine.py ... --engine-env   # in loopeval engine-env's environment (docs/engine.md)

``smollm2``: ``loopeval import-gguf``'s folder; ``local_tasks``: ``loopeval local-tasks``'s (real GSM8K).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def run(model: str, tasks_dir: str, *, engine: str, loop: str | None, limit: int, budget_scale: float,
        batch_size: int | str, threads: int) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from loopeval.model_adapters.looped import LoopedLM
    from loopeval.evaluation.trace import find_traces

    trace = tempfile.mkdtemp(prefix="bench_engine_")
    args = dict(pretrained=model, batch_size=batch_size, budget_scale=budget_scale, trace=trace)
    if loop:
        args["loop"] = loop
    if engine == "vllm":
        args.update(engine="vllm", dtype="float32", enforce_eager=True, max_model_len=2048)
    else:
        args.update(device="cpu", dtype="float32")
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    lm = LoopedLM(**args)
    loaded = time.perf_counter()
    result = simple_evaluate(model=lm, tasks=["gsm8k_boxed"], limit=limit, apply_chat_template=True, log_samples=True,
                             task_manager=TaskManager(include_path=tasks_dir, include_defaults=False), verbosity="ERROR")
    wall = time.perf_counter() - loaded
    (t,) = find_traces(trace)
    tokens = sum(i.generated_tokens for i in t.items)
    responses = {s["doc_id"]: s["resps"][0][0] for s in result["samples"]["gsm8k_boxed"]}
    del lm
    gc.collect()
    return {"engine": engine, "loop": loop or "-", "batch": batch_size, "load_s": loaded - start, "wall_s": wall,
            "tokens": tokens, "tokens_per_s": tokens / wall, "lengths": sorted(i.generated_tokens for i in t.items),
            "responses": responses}


def interleaved(model: str, loop: str, *, rounds: int, prompts: int = 16, prompt_tokens: int = 60,
                new_tokens: int = 64) -> list[float]:
    """Looped / unlooped wall time of the same generation on the engine, both engines alive and
    interleaved round by round (so a change in the machine's load hits both), one ratio per round."""
    from loopeval.core.spec import LoopConfig
    from loopeval.engines.vllm_engine import configure_environment
    from loopeval.engines.vllm_models import engine_overrides, register

    configure_environment()
    register()
    from transformers import AutoConfig
    from vllm import LLM, SamplingParams, TokensPrompt

    architecture = AutoConfig.from_pretrained(model).architectures[0]
    common = dict(dtype="float32", enforce_eager=True, distributed_executor_backend="uni", max_model_len=512)
    engines = [LLM(model, **common), LLM(model, **common, hf_overrides=engine_overrides(architecture, LoopConfig(loop)))]
    batch = [TokensPrompt(prompt_token_ids=list(range(100 + i, 100 + i + prompt_tokens))) for i in range(prompts)]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    ratios = []
    for _ in range(rounds):
        times = []
        for llm in engines:
            start = time.perf_counter()
            llm.generate(batch, params, use_tqdm=False)
            times.append(time.perf_counter() - start)
        ratios.append(times[1] / times[0])
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks-dir", required=True)
    parser.add_argument("--loop", default="14:16x2", help="the looped rows' loop; '-': unlooped rows only")
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--budget-scale", type=float, default=512 / 768, help="gsm8k_boxed's 768 tokens times this")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--engine-batch-size", default="auto",
                        help="the engine rows' batch size: 'auto' (default, lm-eval's convention for vLLM) hands "
                             "every request to vLLM at once and vLLM batches them continuously; a number hands that "
                             "many at a time, as the HF path batches")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--engine-env", action="store_true",
                        help="start again with loopeval engine-env's environment (LD_PRELOAD of libiomp5 ...)")
    parser.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                        help="only measure looped / unlooped on the engine, interleaved, over ROUNDS rounds")
    a = parser.parse_args()
    if a.engine_env:
        from loopeval.engines.runtime import engine_environment

        env = engine_environment()
        if "LD_PRELOAD" in env:  # a preload works from a process's start only; the new process finds it set
            os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})
    print(f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}, load average {os.getloadavg()[0]:.1f}", flush=True)
    if a.interleave:
        ratios = interleaved(a.model, a.loop, rounds=a.interleave)
        print(f"engine looped / unlooped per round: {', '.join(f'{r:.3f}' for r in ratios)} "
              f"(median {sorted(ratios)[len(ratios) // 2]:.3f})")
        return
    rows = [run(a.model, a.tasks_dir, engine=engine, loop=loop, limit=a.limit, budget_scale=a.budget_scale,
                batch_size=a.batch_size if engine == "hf" else a.engine_batch_size, threads=a.threads)
            for engine in ("hf", "vllm") for loop in (None, a.loop) if loop != "-"]
    print("| path | loop | batch | load | wall | tokens | tokens/s | responses = HF path's |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        hf = next(h for h in rows if h["engine"] == "hf" and h["loop"] == r["loop"])
        same = sum(r["responses"][d] == hf["responses"][d] for d in hf["responses"])
        print(f"| {r['engine']} | {r['loop']} | {r['batch']} | {r['load_s']:.1f} s | {r['wall_s']:.1f} s | "
              f"{r['tokens']} | {r['tokens_per_s']:.1f} | {same}/{len(hf['responses'])} |")
    by = {(r["engine"], r["loop"]): r for r in rows}
    for engine in ("hf", "vllm") if a.loop != "-" else ():
        ratio = by[(engine, a.loop)]["wall_s"] / by[(engine, "-")]["wall_s"]
        print(f"{engine}: looped / unlooped wall = {ratio:.3f}")
    for loop in dict.fromkeys(("-", a.loop)):
        print(f"loop {loop}: engine / HF path tokens/s = "
              f"{by[('vllm', loop)]['tokens_per_s'] / by[('hf', loop)]['tokens_per_s']:.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps([{k: v for k, v in r.items() if k != "responses"} for r in rows], indent=1))


if __name__ == "__main__":
    main()
