"""Checks of the package as a user gets it: the quickstart example and the documentation."""

import os
import subprocess
import sys

import pytest

import benni_inference as bi
from conftest import SOURCE_DIR

pytestmark = pytest.mark.installed


def test_quickstart_example_prints_a_completion():
    example = os.path.join(SOURCE_DIR, "examples", "quickstart.py")
    r = subprocess.run(
        [sys.executable, example], capture_output=True, text=True, timeout=300, check=False
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip()) > 20, r.stdout


def test_help_shows_documented_methods():
    r = subprocess.run(
        [sys.executable, "-c", "import benni_inference; help(benni_inference.BieEngine)"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PAGER": "cat"},
        check=True,
    )
    for text in ("generate(", "stream(", "chat(", "tokenize(", "detokenize(", "plan(", "close(",
                 "continuous batching", "KeyboardInterrupt", "BieOutOfMemory"):
        assert text in r.stdout, text


def test_typing_files_are_installed():
    pkg = os.path.dirname(bi.__file__)
    assert os.path.exists(os.path.join(pkg, "py.typed"))
    assert os.path.exists(os.path.join(pkg, "__init__.pyi"))
    assert bi.EngineConfig.__doc__ and bi.SamplingParams.__doc__ and bi.RequestOutput.__doc__
