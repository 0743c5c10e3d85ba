"""``loopeval serve`` where vLLM is not installed (the server itself: tests/engines/test_server.py)."""

import importlib.util

import pytest


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_missing_vllm_is_refused_with_the_install_line(tmp_path, capsys):
    from loopeval.cli import main

    assert main(["serve", str(tmp_path), "--loop", "1:3x2", "--port", "8001"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("loopeval serve: error: vLLM is not installed in this environment: the vLLM engine needs "
                          "vLLM: on a CPU machine") and "pip install" in err
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--vllm-help=all"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--vllm-help: vLLM is not installed in this environment" in err


def test_other_commands_still_refuse_unknown_options(capsys):
    from loopeval.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["tasks-path", "--no-such-option"])
    assert exit_.value.code == 2 and "unrecognized arguments: --no-such-option" in capsys.readouterr().err
