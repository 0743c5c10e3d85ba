"""loopeval's lm-eval tasks, run through lm-eval on local copies of the hub datasets.

Each task reads a fixture file with the hub dataset's fields instead of the hub
(:func:`local_tasks`), and a scripted model gives answers the tests choose.
"""

import hashlib
import importlib.util
import json
import random
import re

import pytest
from lm_eval.loggers import EvaluationTracker
from lm_eval.tasks import TaskManager
from lm_eval.utils import make_table

from support import FIXTURES, FIXTURE_FILES, ScriptedLM, TASKS, _IgnoreTags, evaluate, local_tasks, rows, write_jsonl, read_records

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

# task -> fixture file with the fields of its hub dataset
FIXTURE_FILES |= {f"{task}_think": name for task, name in FIXTURE_FILES.items() if task.endswith("_boxed")}


_IgnoreTags.add_multi_constructor("!", lambda loader, suffix, node: None)


def by_question(script: dict[str, list[str]]):
    """A ``respond`` that finds which key of ``script`` the prompt contains and returns that
    key's responses in turn (one per repeat)."""
    queues = {key: iter(responses) for key, responses in script.items()}

    def respond(prompt):
        (key,) = [k for k in queues if k in prompt]
        return next(queues[key])

    return respond


def chatml(user_turn: str) -> str:
    return f"<|im_start|>user\n{user_turn}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return local_tasks(tmp_path_factory.mktemp("tasks"), {t: FIXTURES / f for t, f in FIXTURE_FILES.items()})


GSM8K = {  # question -> response; acc 3/4, boxed 2/4
    "Natalia sold clips": ["48/2 = 24 in May, 48 + 24 = 72 in all.\n\\boxed{72}"],
    "Weng earns $12": ["12/60 = 0.2 per minute, 0.2 * 50 = 10. She earned $10."],
    "A bakery sells 400": ["<think>400*3 = \\boxed{1100}?</think> It sells \\boxed{1,200} loaves."],
    "James writes a 3-page": ["<think>3*2*2 = 12 a week, 12*52 = \\boxed{624}"],
}
MATH500 = {  # acc 1/2, boxed 2/2, one unparsable answer
    "Convert the point": ["r = 3 and theta = pi/2, so $\\boxed{(3, \\frac{\\pi}{2})}$."],
    "Simplify $\\sqrt{242}$": ["$\\sqrt{242} = \\boxed{11\\sqrt2 +}$"],
}
AIME24 = {  # acc (3/8 + 8/8) / 2
    "Every morning Aya": [r"\boxed{204}"] * 3 + [r"\boxed{200}"] * 5,
    "There exist real numbers": [r"\boxed{25}", r"so $xy = \boxed{25}$", r"\boxed{25.0}"] + [r"\boxed{25}"] * 5,
}
AIME25 = {  # acc (8/8 + 0/8) / 2, boxed 1/2
    "integer bases": [r"\boxed{70}"] * 8,
    "heptagon": [r"the area is \boxed{58"] * 8,
}


def gpqa_respond(prompt: str) -> str:
    """Box the letter of the correct answer, except for the last two questions (wrong letter)."""
    (row,) = [r for r in rows("gpqa_diamond.jsonl") if r["Question"].strip() in prompt]
    listed = dict(re.findall(r"^([A-D])\. (.*)$", prompt, re.MULTILINE))
    (letter,) = [k for k, text in listed.items() if text == row["Correct Answer"].strip()]
    if row["Record ID"] in ("recGPQA0007", "recGPQA0008"):
        letter = "ABCD"[("ABCD".index(letter) + 1) % 4]
    return f"The answer is \\boxed{{\\text{{({letter})}}}}."


def test_generative_prompt_is_one_user_turn(tokenizer, local):
    lm = ScriptedLM(tokenizer, respond=lambda prompt: r"\boxed{0}")
    evaluate(lm, ["gsm8k_boxed", "math500_boxed"], local, limit=2)
    natalia = rows("gsm8k.jsonl")[0]["question"]
    assert lm.generations[0][0] == chatml(f"{natalia}\n{INSTRUCTION}")
    # The MATH-500 problem ends in "\n"; the question is stripped before the instruction.
    assert lm.generations[3][0] == chatml(f"Simplify $\\sqrt{{242}}$.\n{INSTRUCTION}")

    plain = ScriptedLM(tokenizer, respond=lambda prompt: r"\boxed{0}")
    evaluate(plain, ["gsm8k_boxed"], local, chat=False, limit=1)
    assert plain.generations[0][0] == f"{natalia}\n{INSTRUCTION}"


def test_loop_core_scores_and_unweighted_macro(tokenizer, local, tmp_path):
    lm = ScriptedLM(tokenizer, respond=by_question(GSM8K | MATH500))
    tracker = EvaluationTracker(output_path=str(tmp_path / "out"))
    results = evaluate(lm, ["loop_core"], local, evaluation_tracker=tracker)

    gsm8k, math500 = results["results"]["gsm8k_boxed"], results["results"]["math500_boxed"]
    assert (gsm8k["acc,none"], gsm8k["boxed,none"], gsm8k["scoring_failures,none"]) == (0.75, 0.5, 0)
    assert (math500["acc,none"], math500["boxed,none"], math500["scoring_failures,none"]) == (0.5, 1.0, 1)
    # The unweighted mean of 3/4 and 1/2, not the pooled 4/6.
    assert results["groups"]["loop_core"]["acc,none"] == pytest.approx(0.625)
    assert results["groups"]["loop_core"]["boxed,none"] == pytest.approx(0.75)

    # Budgets, and EOS as the only stop.
    kwargs = {prompt.split("\n")[1][:12]: kw for prompt, kw in lm.generations}
    assert kwargs["Natalia sold"] == {"until": [], "do_sample": False, "temperature": 0.0, "max_gen_toks": 768}
    assert kwargs["Convert the "]["max_gen_toks"] == 2048 and kwargs["Convert the "]["until"] == []

    # The extracted answers reach samples_*.jsonl as strings, and the run saves like the CLI does.
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task in results["configs"]:
        tracker.save_results_samples(task_name=task, samples=samples[task])
    (saved,) = (tmp_path / "out").rglob("samples_gsm8k_boxed_*.jsonl")
    logged = read_records(saved)
    assert [s["extracted"] for s in logged] == ["72", "10", "1,200", None]
    assert [s["acc"] for s in logged] == [1.0, 1.0, 1.0, 0.0]
    (aggregated,) = (tmp_path / "out").rglob("results_*.json")
    assert json.loads(aggregated.read_text())["results"]["gsm8k_boxed"]["extracted,none"] is None
    assert "scoring_failures" in make_table(results)


def test_aime_averages_eight_samples(tokenizer, local):
    lm = ScriptedLM(tokenizer, respond=by_question(AIME24))
    results = evaluate(lm, ["aime24_boxed"], local)
    assert len(lm.generations) == 16
    sampling = {"until": [], "do_sample": True, "temperature": 0.6, "top_p": 0.95, "max_gen_toks": 4096}
    assert all(kw == sampling for _, kw in lm.generations)
    assert results["results"]["aime24_boxed"]["acc,none"] == pytest.approx((3 / 8 + 1) / 2)
    first = results["samples"]["aime24_boxed"][0]
    assert (first["acc"], first["extracted"]) == (3 / 8, ["204"] * 3 + ["200"] * 5)


def test_loop_full_macro_over_five_benchmarks(tokenizer, local):
    script = by_question(GSM8K | MATH500 | AIME24 | AIME25)
    lm = ScriptedLM(tokenizer, respond=lambda p: gpqa_respond(p) if "\nA. " in p else script(p))
    results = evaluate(lm, ["loop_full"], local)
    accs = {task: results["results"][task]["acc,none"] for task in results["group_subtasks"]["loop_full"]}
    expected = {"gsm8k_boxed": 0.75, "math500_boxed": 0.5, "aime24_boxed": 0.6875, "aime25_boxed": 0.5}
    assert accs == pytest.approx(expected | {"gpqa_diamond_boxed": 0.75})
    assert results["groups"]["loop_full"]["acc,none"] == pytest.approx(sum(accs.values()) / 5)
    assert results["results"]["aime25_boxed"]["boxed,none"] == 0.5


def test_thinking_variants_need_a_closed_thinking_block(tokenizer, local):
    script = {
        "Natalia sold": ["48 + 24 = 72</think>\n\n\\boxed{72}"],
        "Weng earns $12": ["0.2 * 50 = 10, so \\boxed{10}"],  # never closes the block the prompt opened
        "A bakery sells 400": ["</think>\\boxed{1200}"],
        "James writes a 3-page": ["</think>It is 624 pages."],  # number fallback after thinking
        "Convert the point": ["</think>\\boxed{(3, \\frac{\\pi}{2})}"],
        "Simplify $\\sqrt{242}$": ["\\boxed{11\\sqrt{2}}"],
    }
    lm = ScriptedLM(tokenizer, respond=by_question(script))
    results = evaluate(lm, ["loop_core_think"], local)
    assert results["results"]["gsm8k_boxed_think"]["acc,none"] == 0.75
    assert results["results"]["gsm8k_boxed_think"]["boxed,none"] == 0.5
    assert results["results"]["math500_boxed_think"]["acc,none"] == 0.5
    assert results["groups"]["loop_core_think"]["acc,none"] == pytest.approx(0.625)
    budgets = {kw["max_gen_toks"] for prompt, kw in lm.generations if "Natalia" in prompt or "Weng" in prompt}
    assert budgets == {4096}


def test_gpqa_choices_are_shuffled_the_same_way_every_run(tokenizer, tmp_path):
    # The second run sees the questions in reverse order and under another seed: each
    # question's order must depend on that question alone.
    gpqa = rows("gpqa_diamond.jsonl")
    prompts = []
    for run, (data, seed) in enumerate([(gpqa, 0), (gpqa[::-1], 1234)]):
        data_file = write_jsonl(tmp_path / f"run{run}.jsonl", data)
        include = local_tasks(tmp_path / f"run{run}", {"gpqa_diamond_boxed": data_file})
        lm = ScriptedLM(tokenizer, respond=gpqa_respond)
        results = evaluate(lm, ["gpqa_diamond_boxed"], include, random_seed=seed)
        assert results["results"]["gpqa_diamond_boxed"]["acc,none"] == 0.75
        prompts.append({row["Record ID"]: prompt for row, (prompt, _) in zip(data, lm.generations)})
        if run == 0:
            targets = [s["target"] for s in results["samples"]["gpqa_diamond_boxed"]]
    assert prompts[0] == prompts[1]

    gold_letters = []
    for row in gpqa:
        prompt = prompts[0][row["Record ID"]]
        listed = re.findall(r"^([A-D])\. (.*)$", prompt, re.MULTILINE)
        answers = [row["Correct Answer"]] + [row[f"Incorrect Answer {k}"] for k in (1, 2, 3)]
        assert sorted(text for _, text in listed) == sorted(a.strip() for a in answers)
        gold_letters.append(next(letter for letter, text in listed if text == row["Correct Answer"].strip()))
        options = "\n".join(f"{k}. {t}" for k, t in listed)
        assert prompt == chatml(f"{row['Question'].strip()}\n\n{options}\n{INSTRUCTION}")
    assert len(set(gold_letters)) > 1  # actually shuffled, not always in dataset order
    # The gold each sample logs is the letter under which the correct answer is listed.
    assert targets == gold_letters


ARC_PICKS = {"planet rotates faster": "C", "best conductor": "B", "carries blood away": "A"}  # acc 2/3
CSQA_PICKS = {"revolving door": "A", "aim to do at work": "B"}  # acc 1/2


def pick_by_question(picks):
    def pick(prompt):
        (key,) = [k for k in picks if k in prompt]
        return picks[key]

    return pick


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_letter_tasks_score_the_next_token_letter(tokenizer, local, chat):
    lm = ScriptedLM(tokenizer, pick=pick_by_question(ARC_PICKS | CSQA_PICKS))
    results = evaluate(lm, ["arc_challenge_letter", "commonsenseqa_letter"], local, chat=chat)
    assert results["results"]["arc_challenge_letter"]["acc,none"] == pytest.approx(2 / 3)
    assert results["results"]["commonsenseqa_letter"]["acc,none"] == 0.5

    numbered = (
        "Question: Which object is the best conductor of electricity?\n"
        "A. a wax crayon\nB. an iron nail\nC. a plastic spoon\nD. a wooden stick\nAnswer:"
    )
    prompt = chatml(numbered) if chat else numbered
    continuations = [cont for p, cont in lm.scored if p == prompt]
    # lm-eval puts the target delimiter " " before the letter only without a chat template.
    assert continuations == ([" A", " B", " C", " D"] if not chat else ["A", "B", "C", "D"])
    five = [cont.strip() for p, cont in lm.scored if "carries blood away" in p]
    assert five == ["A", "B", "C", "D", "E"]


def mmlu_pro_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        options = [f"option {k} of question {i}" for k in range(10 if i % 3 else 4)]
        gold = rng.randrange(len(options))
        out.append(
            {
                "question_id": 70 + 3 * i,
                "question": f"Question number {i}?",
                "options": options,
                "answer": "ABCDEFGHIJ"[gold],
                "answer_index": gold,
                "cot_content": "",
                "category": ["math", "law", "physics"][i % 3],
                "src": "fixture",
            }
        )
    return out


def test_mmlu_pro_2k_is_the_documented_fixed_subset(tokenizer, tmp_path):
    records = mmlu_pro_rows(2100)
    shuffled = random.Random(1).sample(records, len(records))
    chosen = []
    for name, data in [("ordered", records), ("shuffled", shuffled)]:
        include = local_tasks(tmp_path / name, {"mmlu_pro_2k": write_jsonl(tmp_path / f"{name}.jsonl", data)})
        manager = TaskManager(include_path=[str(TASKS), str(include)], include_defaults=False)
        task = manager.load(["mmlu_pro_2k"])["tasks"]["mmlu_pro_2k"]
        chosen.append([doc["question_id"] for doc in task.eval_docs])
    # The rule of docs/tasks.md: the 2,000 smallest SHA-256 digests of str(question_id).
    by_digest = sorted((r["question_id"] for r in records), key=lambda q: hashlib.sha256(str(q).encode()).hexdigest())
    expected = set(by_digest[:2000])
    assert len(chosen[0]) == 2000 and set(chosen[0]) == set(chosen[1]) == expected
    assert chosen[0] == [r["question_id"] for r in records if r["question_id"] in expected]  # dataset order

    picks = {f"Question number {i}?": records[i]["answer"] for i in range(2100)}
    lm = ScriptedLM(tokenizer, pick=pick_by_question(picks))
    results = evaluate(lm, ["mmlu_pro_2k"], tmp_path / "ordered", chat=False, limit=3)
    assert results["results"]["mmlu_pro_2k"]["acc,none"] == 1.0
    first = next(r for r in records if r["question_id"] == chosen[0][0])
    options = "".join(f"{letter}. {text}\n" for letter, text in zip("ABCDEFGHIJ", first["options"]))
    assert lm.scored[0][0] == f"Question: {first['question']}\n{options}Answer:"
    letters = "ABCDEFGHIJ"[: len(first["options"])]
    assert [cont for _, cont in lm.scored[: len(letters)]] == [f" {x}" for x in letters]


def test_mmlu_pro_subset_refuses_a_short_or_ambiguous_split():
    from datasets import Dataset

    utils = load_task_utils()
    with pytest.raises(ValueError, match="fewer than the subset's 2000"):
        utils.mmlu_pro_subset(Dataset.from_list(mmlu_pro_rows(10)))
    duplicated = mmlu_pro_rows(3)
    duplicated[2]["question_id"] = duplicated[0]["question_id"]
    with pytest.raises(ValueError, match="not unique"):
        utils.mmlu_pro_subset(Dataset.from_list(duplicated), size=2)


def load_task_utils():
    spec = importlib.util.spec_from_file_location("loopeval_task_utils", TASKS / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CANONICAL = {  # task -> (dataset_path, dataset_name, test_split)
    "gsm8k_boxed": ("openai/gsm8k", "main", "test"),
    "math500_boxed": ("HuggingFaceH4/MATH-500", None, "test"),
    "aime24_boxed": ("Maxwell-Jia/AIME_2024", None, "train"),
    "aime25_boxed": ("math-ai/aime25", None, "test"),
    "gpqa_diamond_boxed": ("Idavidrein/gpqa", "gpqa_diamond", "train"),
    "mmlu_pro_2k": ("TIGER-Lab/MMLU-Pro", None, "test"),
    "arc_challenge_letter": ("allenai/ai2_arc", "ARC-Challenge", "test"),
    "commonsenseqa_letter": ("tau/commonsense_qa", None, "validation"),
}
CANONICAL |= {f"{task}_think": source for task, source in CANONICAL.items() if task.endswith("_boxed")}
CANONICAL["gsm8k_nll"] = CANONICAL["gsm8k_boxed"]
BUDGETS = {"gsm8k_boxed": 768, "gsm8k_boxed_think": 4096, "math500_boxed": 2048}


def test_every_task_reads_its_canonical_hub_dataset():
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    assert set(manager.all_subtasks) == set(CANONICAL)
    assert set(manager.all_groups) == {"loop_core", "loop_full", "loop_core_think", "loop_full_think"}
    for task, (path, name, split) in CANONICAL.items():
        config = manager.task_index[task].cfg
        assert (config["dataset_path"], config.get("dataset_name"), config["test_split"]) == (path, name, split), task
        if task in BUDGETS:
            assert config["generation_kwargs"]["max_gen_toks"] == BUDGETS[task]
        if config["output_type"] == "generate_until":
            assert config["generation_kwargs"]["until"] == []
