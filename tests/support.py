"""Helpers shared by test modules (plain functions and classes; fixtures live in conftest.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import lm_eval
import torch
import yaml
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager
from torch import nn

from loopeval import LoopSpec
from loopeval.common.paths import tasks_path
from loopeval.evaluation.local_data import local_task


TASKS = tasks_path()


FIXTURES = Path(__file__).parent / "fixtures" / "tasks"


FIXTURE_FILES = {
    "gsm8k_boxed": "gsm8k.jsonl",
    "math500_boxed": "math500.jsonl",
    "aime24_boxed": "aime24.jsonl",
    "aime25_boxed": "aime25.jsonl",
    "gpqa_diamond_boxed": "gpqa_diamond.jsonl",
    "arc_challenge_letter": "arc_challenge.jsonl",
    "commonsenseqa_letter": "commonsenseqa.jsonl",
}


class _IgnoreTags(yaml.SafeLoader):
    """Reads lm-eval YAML without resolving ``!function`` tags."""


def local_tasks(folder: Path, data_files: dict[str, Path]) -> Path:
    """Write into ``folder`` one YAML per task that includes loopeval's YAML of the same name
    and reads ``data_files[task]`` (JSON lines) instead of the hub dataset
    (:func:`loopeval.evaluation.local_data.local_task`); return ``folder``.

    Pass ``[tasks_path(), folder]`` as lm-eval's include path: the later folder wins, so
    loopeval's groups pick up the local tasks.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for task, data in data_files.items():
        config = local_task(task, "json", [data], cache_dir=folder.with_name(f"{folder.name}_hf"))
        (folder / f"{task}.yaml").write_text(yaml.safe_dump(config))
    return folder


class ScriptedLM(LM):
    """A model that answers from a script: ``respond(prompt)`` is the generated text and
    ``pick(prompt)`` the option letter it prefers. It records every request it gets."""

    def __init__(self, tokenizer, respond=None, pick=None):
        super().__init__()
        self._tokenizer = tokenizer
        self.respond, self.pick = respond, pick
        self.generations = []  # (prompt, generation kwargs)
        self.scored = []  # (prompt, continuation)

    def apply_chat_template(self, chat_history, add_generation_prompt=True):
        return self._tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    @property
    def tokenizer_name(self):
        return "tiny-chatml"

    def chat_template(self, chat_template=False):
        return self._tokenizer.chat_template

    def generate_until(self, requests):
        self.generations += [r.args for r in requests]
        return [self.respond(r.args[0]) for r in requests]

    def loglikelihood(self, requests):
        pairs = [r.args for r in requests]
        self.scored += pairs
        return [(0.0 if cont.strip() == self.pick(prompt) else -1.0, False) for prompt, cont in pairs]

    def loglikelihood_rolling(self, requests):
        raise AssertionError("no loopeval task asks for rolling log-likelihoods")


def evaluate(lm, tasks, include: Path, *, chat=True, **kwargs):
    manager = TaskManager(include_path=[str(TASKS), str(include)], include_defaults=False)
    return lm_eval.simple_evaluate(
        model=lm, tasks=tasks, task_manager=manager, apply_chat_template=chat, bootstrap_iters=0, **kwargs
    )


def rows(name: str) -> list[dict]:
    return read_records(FIXTURES / name)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def manual_loop(model, ids, window, step):
    """Run the decoder by hand: ``step(g, x0)`` gives the window's output, where
    ``g(h)`` applies layers window[0]..window[1]-1 once, uncached."""
    from transformers.masking_utils import create_causal_mask

    inner = model.model
    x = inner.embed_tokens(ids)
    pos = torch.arange(ids.shape[1]).unsqueeze(0)
    pe = inner.rotary_emb(x, pos)
    mask = create_causal_mask(config=model.config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=pos)

    kwargs = dict(attention_mask=mask, position_embeddings=pe, position_ids=pos)

    def layer(j, h):
        return inner.layers[j](h, **kwargs)

    def g(h):
        for j in range(*window):
            h = layer(j, h)
        return h

    g.kwargs = {j: kwargs for j in range(len(inner.layers))}

    h = x
    for j in range(window[0]):
        h = layer(j, h)
    h = step(g, h)
    for j in range(window[1], len(inner.layers)):
        h = layer(j, h)
    return model.lm_head(inner.norm(h))


def naive_loop(model, spec):
    """The common mistake: reuse the layer modules in a longer layer list, so every
    pass of a layer writes the same cache slot (its own ``layer_idx``)."""
    schedule = LoopSpec.parse(spec).schedule(len(model.model.layers))
    model.model.layers = nn.ModuleList(model.model.layers[j] for j in schedule)
    model.config.layer_types = [model.config.layer_types[j] for j in schedule]
    model.config.num_hidden_layers = len(schedule)
    return model


def read_samples(out: Path, task: str) -> dict[int, dict]:
    (file,) = out.rglob(f"samples_{task}_*.jsonl")
    return {s["doc_id"]: s for s in map(json.loads, file.read_text().splitlines())}


def run_lm_eval(*args, cwd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "lm_eval", "--device", "cpu", "--batch_size", "4", "--log_samples", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


LETTERS = "abcdefghij"
"""The training tests' alphabet: cyclic letter runs a tiny model learns in a few steps."""


def letter_rows(n: int, length: int, *, spread: int = 1, stride: int = 1, step: int = 1) -> list[dict]:
    """``n`` text rows of cyclic letter runs: row ``i`` starts at letter ``stride * i`` and
    has ``length + i % spread`` letters, each ``step`` after the last."""
    return [{"text": " ".join(LETTERS[(stride * i + step * k) % 10] for k in range(length + i % spread))}
            for i in range(n)]


def read_records(path) -> list[dict]:
    """Every record of a JSON-lines file (the tests' one raw reader)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_generate_task(folder, name: str, rows: list[dict], *, max_gen_toks: int) -> None:
    """A greedy lm-eval generation task ``name`` over ``rows`` ({"question", "answer"}), in ``folder``."""
    import json
    from pathlib import Path

    import yaml

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{name}.yaml").write_text(yaml.safe_dump({
        "task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test", "output_type": "generate_until",
        "doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": [], "max_gen_toks": max_gen_toks, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }))


def write_tiny_gguf(path, arch="llama", *, blocks=2, width=64, drop=(), extra=(), vocab=64, tokens=None, scores=True):
    """A tiny float32 GGUF of ``arch`` written by the gguf library (an independent writer);
    ``tokens`` (a list of token strings) is written as its ``gpt2`` tokenizer's token list,
    with scores by position (transformers derives a byte-level BPE's merges from them)."""
    import numpy as np
    from gguf import GGUFWriter

    rng = np.random.default_rng(0)
    heads, kv, ff = 4, 2, 96
    w = GGUFWriter(str(path), arch)
    if tokens is not None:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(tokens)
        if scores:  # transformers derives the merges from them
            w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_block_count(blocks)
    w.add_context_length(128)
    w.add_embedding_length(width)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    shapes = {"token_embd.weight": (vocab, width), "output_norm.weight": (width,)}
    hd = width // heads
    for b in range(blocks):
        shapes.update({f"blk.{b}.attn_norm.weight": (width,), f"blk.{b}.attn_q.weight": (width, width),
                       f"blk.{b}.attn_k.weight": (kv * hd, width), f"blk.{b}.attn_v.weight": (kv * hd, width),
                       f"blk.{b}.attn_output.weight": (width, width), f"blk.{b}.ffn_norm.weight": (width,),
                       f"blk.{b}.ffn_gate.weight": (ff, width), f"blk.{b}.ffn_up.weight": (ff, width),
                       f"blk.{b}.ffn_down.weight": (width, ff)})
    shapes.update(dict(extra))
    for name, shape in shapes.items():
        if name not in drop:
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32) * 0.02)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def drop_gguf_tensor(source, out, name: str):
    """A copy of the GGUF ``source`` at ``out`` whose tensor table lacks ``name`` (its bytes stay
    in the data section, unreferenced): the table is located by the gguf library's reader, an
    independent parser, and every other byte is copied as it is."""
    import struct

    from gguf import GGUFReader

    reader = GGUFReader(str(source))
    raw = Path(source).read_bytes()
    entries = {t.name: (t.field.offset, sum(p.nbytes for p in t.field.parts)) for t in reader.tensors}
    assert name in entries, f"{source} has no tensor {name}"
    first = min(start for start, _ in entries.values())
    table = b"".join(raw[start:start + size] for t, (start, size) in entries.items() if t != name)
    head = raw[:8] + struct.pack("<Q", len(entries) - 1) + raw[16:first] + table
    head += bytes(-len(head) % reader.alignment)
    Path(out).write_bytes(head + raw[reader.data_offset:])
    return Path(out)


def assert_close_in_float32(actual, expected) -> None:
    """``actual`` equals ``expected`` (float32 activations or logits computed another correct way:
    other batch shapes, a cache, an unrolled copy) within float32 rounding: per vector along the
    last dimension, ``loopeval.core.cache_check.rounding_tolerance`` of ``expected``, i.e.
    2e-4 of its largest magnitude (at least 1e-3), the rule the cache check uses. A wrong cache
    slot or a misplaced pass differs by a sizeable fraction of the vector."""
    import torch

    from loopeval.core.cache_check import rounding_tolerance

    expected = expected.float()
    gap = (actual.float() - expected).abs().amax(-1)
    tolerance = rounding_tolerance(expected, torch.float32)
    worst = int((gap - tolerance).flatten().argmax())
    assert bool((gap <= tolerance).all()), (
        f"gap {gap.flatten()[worst].item():.3g} past float32 rounding ({tolerance.flatten()[worst].item():.3g}) "
        f"at vector {worst} of {gap.numel()}")


_SPIN = """\
import multiprocessing as m, os

def spin(started):
    started.put(os.getpid())
    while True:
        pass

started = m.Queue()
workers = [m.Process(target=spin, args=(started,), daemon=True) for _ in range(os.cpu_count())]
for w in workers:
    w.start()
for _ in workers:
    started.get()
print("spinning", flush=True)
for w in workers:
    w.join()
"""


class busy_machine:
    """A context in which another process spins on every core: the body starts once every
    spinner has started (it says so), and the spinners are killed with their group after it."""

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", _SPIN], start_new_session=True, stdout=subprocess.PIPE,
                                        text=True, env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
        line = self.process.stdout.readline().strip()
        if line != "spinning":
            self.__exit__()
            raise RuntimeError(f"the competing job did not start: it printed {line!r}")
        return self

    def __exit__(self, *exc):
        import signal

        os.killpg(self.process.pid, signal.SIGKILL)  # the spinners too
        self.process.wait()
        self.process.stdout.close()


# Tiny lm-eval tasks of the looped-model tests (tests/evaluation, tests/engines).
QUESTIONS = [
    "Tom has 3 apples and buys 4 more. How many?",
    "A train travels 60 miles in 1.5 hours. Speed?",
    "What is 12 + 30?",
    "Sara reads 5 pages a day for 6 days. Pages?",
    "2 + 2 =",
    "A box holds 8 eggs; 3 boxes hold?",
]

MC_YAML = """\
task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}\\nAnswer:"
doc_to_choice: [" A", " B", " C"]
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
"""
