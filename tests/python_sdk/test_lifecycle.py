"""Ctrl-C, cancellation and teardown: the engine stops cleanly and leaves no threads behind."""

import _thread
import threading
import time

import pytest

import benni_inference as bi
from conftest import small_config, thread_counts

LONG = bi.SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True)


def wait_until_idle(engine, timeout=5.0):
    """The engine updates its gauges just after a request's last callback: poll briefly."""
    deadline = time.monotonic() + timeout
    while True:
        m = engine.metrics()
        if m["requests_running"] == 0 and m["requests_waiting"] == 0:
            assert all(p["blocks_used"] == 0 for p in m["pools"]), m["pools"]
            return
        assert time.monotonic() < deadline, m
        time.sleep(0.02)


def interrupt_main_after(seconds):
    t = threading.Timer(seconds, _thread.interrupt_main)
    t.start()
    return t


def test_keyboard_interrupt_cancels_a_long_generate(engine):
    timer = interrupt_main_after(0.5)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        engine.generate(["Count slowly: 1, 2, 3,", "List every prime:"], LONG)
    assert time.monotonic() - start < 10, "the interrupt was not handled promptly"
    timer.join()
    # The cancelled requests are gone and the engine still serves.
    out = engine.generate("The capital of France is", bi.SamplingParams(temperature=0, max_tokens=4))
    assert out[0].token_ids
    wait_until_idle(engine)


def test_keyboard_interrupt_stops_a_stream(engine):
    timer = interrupt_main_after(0.5)
    n = 0
    with pytest.raises(KeyboardInterrupt):
        for _ in engine.stream("Count slowly: 1, 2, 3,", LONG):
            n += 1
            time.sleep(0.01)  # the interrupt may land in Python code or in the wait
    timer.join()
    assert n < 1000


def test_close_and_context_manager_leave_no_threads():
    py0, os0 = thread_counts()
    with bi.BieEngine(small_config()) as e:
        assert e.generate("Hi", bi.SamplingParams(temperature=0, max_tokens=4))[0].token_ids
        assert thread_counts()[1] > os0  # the engine runs its own threads
    assert e.closed
    assert thread_counts() == (py0, os0)
    with pytest.raises(RuntimeError, match="closed"):
        e.generate("Hi")
    e.close()  # idempotent


def test_interrupt_then_close_leaves_no_threads():
    py0, os0 = thread_counts()
    e = bi.BieEngine(small_config())
    timer = interrupt_main_after(0.3)
    with pytest.raises(KeyboardInterrupt):
        e.generate("Count slowly: 1, 2, 3,", LONG)
    timer.join()
    e.close()
    assert thread_counts() == (py0, os0)


def test_close_while_another_thread_generates():
    py0, os0 = thread_counts()
    e = bi.BieEngine(small_config())
    result = {}

    def worker(engine):
        try:
            result["out"] = engine.generate("Count slowly: 1, 2, 3,", LONG)
        except Exception as ex:  # noqa: BLE001 - recorded for the assertion below
            result["err"] = ex

    t = threading.Thread(target=worker, args=(e,))
    t.start()
    time.sleep(0.5)
    e.close()
    t.join(timeout=30)
    assert not t.is_alive()
    if "out" in result:
        assert result["out"][0].finish_reason == "cancelled"
    else:
        assert isinstance(result["err"], RuntimeError)
    del e, t
    assert thread_counts() == (py0, os0)


def test_dropping_an_engine_without_close_stops_it():
    py0, os0 = thread_counts()
    e = bi.BieEngine(small_config())
    e.generate("Hi", bi.SamplingParams(temperature=0, max_tokens=2))
    del e
    assert thread_counts() == (py0, os0)


def test_threads_share_one_engine(engine):
    params = bi.SamplingParams(temperature=0.0, max_tokens=8)
    want = engine.generate("The capital of France is", params)[0].token_ids
    outs = [None] * 4

    def worker(i):
        outs[i] = engine.generate("The capital of France is", params)[0].token_ids

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert outs == [want] * 4
