"""Shared fixtures for the Python SDK tests: one engine on the default model for the session.

Run through ctest (scripts/python_sdk_test.sh), or by hand:
    PYTHONPATH=build/python python -m pytest tests/python_sdk -m "not installed"
"""

import gc
import os
import threading

import pytest

import benni_inference as bi

SOURCE_DIR = os.environ.get(
    "BIE_SDK_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "installed: checks of the pip-installed package (run by the pip ctest step)"
    )


def small_config(**overrides):
    """The default model with a small context so the tests stay quick on 2 cores."""
    kw = dict(model="default", max_model_len=1024, max_num_seqs=8, threads=2, check_integrity=True)
    kw.update(overrides)
    return bi.EngineConfig(**kw)


@pytest.fixture(scope="session")
def engine():
    e = bi.BieEngine(small_config())
    yield e
    e.close()


def thread_counts():
    """(Python threads, OS threads of this process) after collecting garbage engines."""
    gc.collect()
    return threading.active_count(), len(os.listdir("/proc/self/task"))
