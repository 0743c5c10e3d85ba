"""The one definition of what a result was made from (:mod:`loopeval.evaluation.identity`),
as every done-check applies it: class tests generated from the definition. Each input the
identity covers, changed, makes a finished evaluation stale; each it must not cover,
changed, leaves it done. Checked on the study's done-check without running lm-eval."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from loopeval.evaluation.identity import NOT_OUTPUT_FILES, checkpoint_fingerprint
from loopeval.tools.study import load_study
from loopeval.tools.study.plan import SPEC_NAME, expand, status

ROWS = [{"question": f"What is {a} + {a}?", "answer": str(2 * a)} for a in range(4)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two tiny checkpoints (a model and another), and a task that includes a base YAML,
    reads a local data file and processes its documents with a function in ``utils.py``."""
    from loopeval import save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("identity")
    tok = tiny_tokenizer()
    for name, seed in (("model", 0), ("other", 1)):
        save_model(tiny_model("qwen3", vocab_size=len(tok), num_layers=2, seed=seed), tok, root / name)
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tasks / "utils.py").write_text("def process_docs(dataset):\n    return dataset\n")
    (tasks / "_base.yaml").write_text(yaml.safe_dump({
        "output_type": "generate_until", "test_split": "test", "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": [], "max_gen_toks": 8, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}]}))
    (tasks / "tiny_id.yaml").write_text(
        "include: _base.yaml\ntask: tiny_id\ndataset_path: json\n"
        f"dataset_kwargs: {{data_files: {{test: {tasks / 'data.jsonl'}}}}}\n"
        "process_docs: !function utils.process_docs\ndoc_to_text: \"Question: {{question}}\\nAnswer:\"\n")
    return root


def _study(root: Path, **changes) -> Path:
    study = {"name": "identity", "output": "out", "models": [{"name": "m", "role": "twin", "path": "model"}],
             "tasks": ["tiny_id"], "include_path": ["tasks"], "budgets": [1], "decoding": [{"name": "plain"}],
             "lm_eval": {"batch_size": 2, "device": "cpu"}}
    study.update(changes)
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.fixture
def done(world, tmp_path, monkeypatch):
    """A copy of the world with one evaluation finished (its settings recorded as the runner
    records them); returns a function giving that evaluation's status now. Its outputs are
    taken as complete (``plan.incomplete``, tested in test_study.py): these tests are of the
    settings' identity alone."""
    from loopeval.tools.study import plan

    monkeypatch.setattr(plan, "incomplete", lambda evaluation, study: None)
    root = tmp_path / "w"
    shutil.copytree(world, root)
    (root / "tasks" / "tiny_id.yaml").write_text(
        (root / "tasks" / "tiny_id.yaml").read_text().replace(str(world), str(root)))
    study = load_study(_study(root))
    (evaluation,) = expand(study)
    evaluation.folder.mkdir(parents=True)
    (evaluation.folder / SPEC_NAME).write_text(json.dumps(evaluation.settings(study), default=str))

    def state(**changes) -> str:
        study = load_study(_study(root, **changes))
        (e,) = expand(study)
        return status(e, study)

    assert state() == "done"
    state.root = root
    return state


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


PARTS = {
    # every file loaded for the model args as passed, changed in place (paths unchanged)
    "weights": {
        "weights file": lambda r: (r / "model" / "model.safetensors").write_bytes(
            (r / "model" / "model.safetensors").read_bytes()[:-4] + b"\x00\x00\x00\x40"),
        "config": lambda r: _edit(r / "model" / "config.json", "{", '{"use_cache": false, '),
        "tokenizer": lambda r: _edit(r / "model" / "tokenizer_config.json", "{", '{"model_max_length": 77, '),
        "chat template": lambda r: (r / "model" / "chat_template.jinja").write_text("{{ messages[0]['content'] }}"),
        "generation config": lambda r: _edit(r / "model" / "generation_config.json", "{", '{"max_new_tokens": 3, '),
        "an unknown file": lambda r: (r / "model" / "added_weights.bin").write_bytes(b"\x01\x02"),
        "deleted weights": lambda r: (r / "model" / "model.safetensors").unlink(),
        "a tokenizer folder in the model args": {"models": [{"name": "m", "role": "twin", "path": "model",
                                                              "model_args": {"tokenizer": "other"}}]},
    },
    # the task's whole definition
    "task_definitions": {
        "included YAML": lambda r: _edit(r / "tasks" / "_base.yaml", "max_gen_toks: 8", "max_gen_toks: 9"),
        "task YAML": lambda r: _edit(r / "tasks" / "tiny_id.yaml", "Question:", "Q:"),
        "data file": lambda r: _edit(r / "tasks" / "data.jsonl", '"answer": "6"', '"answer": "7"'),
        "processing function": lambda r: _edit(r / "tasks" / "utils.py", "return dataset", "return dataset.select([0])"),
    },
    # the output settings
    "model_args": {
        "a model arg": {"models": [{"name": "m", "role": "twin", "path": "model", "model_args": {"max_length": 64}}]},
        "a decoding option": {"decoding": [{"name": "plain", "repetition_stop": True}]},
    },
    "lm_eval": {"batch size": {"lm_eval": {"batch_size": 1, "device": "cpu"}},
                "chat template applied": {"lm_eval": {"batch_size": 2, "device": "cpu", "apply_chat_template": True}}},
    "tasks": {"the task list": {"tasks": ["tiny_id", "tiny_id"]}},
}
"""Per part of the recorded identity (the keys of ``Evaluation.settings``), changes of an
input it covers: a function changing files under the world's root, or a study change."""


def test_every_part_of_the_identity_has_its_class_tests(world):
    study = load_study(_study(world))
    (evaluation,) = expand(study)
    assert set(evaluation.settings(study)) == set(PARTS)


@pytest.mark.parametrize(("part", "change"), [(p, c) for p in sorted(PARTS) for c in sorted(PARTS[p])])
def test_a_changed_input_makes_the_result_stale(done, part, change):
    edit = PARTS[part][change]
    state = done(**edit) if isinstance(edit, dict) else (edit(done.root), done())[1]
    assert state.startswith(f"stale: {part}"), state


NOT_COVERED = {
    **{f"a file {p!r}": (lambda r, p=p: (r / "model" / p.replace("*", "notes"))
                         .write_text("not read by any loader")) for p in NOT_OUTPUT_FILES},
    "an output folder inside the checkpoint": lambda r: (
        (r / "model" / "runs" / "x").mkdir(parents=True), (r / "model" / "runs" / "x" / "results.json").write_text("{}")),
    "the weights file touched, same content": lambda r: (r / "model" / "model.safetensors").write_bytes(
        (r / "model" / "model.safetensors").read_bytes()),
    "a README in the task folder": lambda r: (r / "tasks" / "README.md").write_text("# tasks"),
    "the data file moved, the YAML naming its new place": lambda r: (
        shutil.move(r / "tasks" / "data.jsonl", r / "data.jsonl"),
        _edit(r / "tasks" / "tiny_id.yaml", str(r / "tasks" / "data.jsonl"), str(r / "data.jsonl"))),
}
"""Changes that cannot change outputs: generated from NOT_OUTPUT_FILES, plus folders and touches."""


@pytest.mark.parametrize("change", sorted(NOT_COVERED))
def test_a_change_that_cannot_change_outputs_keeps_the_result(done, change):
    NOT_COVERED[change](done.root)
    assert done() == "done", change


def test_a_moved_task_folder_with_the_same_content_is_still_done(done):
    """lm-eval records the YAML's path (metadata.config_source); the fingerprint is by content."""
    shutil.move(done.root / "tasks", done.root / "moved_tasks")
    _edit(done.root / "moved_tasks" / "tiny_id.yaml", str(done.root / "tasks"), str(done.root / "moved_tasks"))
    assert done(include_path=["moved_tasks"]) == "done"


def test_a_moved_checkpoint_is_still_done_and_the_report_settings_do_not_count(done):
    shutil.move(done.root / "model", done.root / "moved")
    assert done(models=[{"name": "m", "role": "twin", "path": "moved"}]) == "done"
    assert done(models=[{"name": "m", "role": "twin", "path": "moved"}], report={"title": "another"}) == "done"


def test_checkpoint_fingerprint_is_by_content(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"\x00" * 16)
    (b / "README.md").write_text("a model card")
    assert checkpoint_fingerprint(a) == checkpoint_fingerprint(b) is not None
    (b / "model.gguf").write_bytes(b"GGUF")
    assert checkpoint_fingerprint(b) != checkpoint_fingerprint(a)
    assert checkpoint_fingerprint(b, gguf_file="model.gguf") == checkpoint_fingerprint(b / "model.gguf")
    assert checkpoint_fingerprint(tmp_path / "missing") is None
