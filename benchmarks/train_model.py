"""The training benchmarks' model and batch (bench_train.py, bench_exit_monitor.py): one
set of command-line options with one set of defaults, so both measure the same model."""

import argparse

DEFAULTS = {"threads": 1, "layers": 6, "hidden": 384, "vocab": 8192, "batch": 4, "length": 128}


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """``--threads --layers --hidden --vocab --batch --length``: a Qwen3-architecture model
    with random weights, trained on batches of ``batch`` rows of ``length`` tokens."""
    for name, default in DEFAULTS.items():
        parser.add_argument(f"--{name}", type=int, default=default)
