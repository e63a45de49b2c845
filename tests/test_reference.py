"""Probing a fast implementation against the installed reference, once per process."""

import threading
import time
import warnings

import pytest

from mmrope_core import reference


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(reference, "_probed", {})


def test_a_probe_runs_once_per_key_and_only_a_failed_one_warns(fresh):
    calls = []

    def probe(answer):
        return lambda: calls.append(answer) or answer

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reference.probe_once(("p", 1), probe("scaled"), fast="p: the fast kernel") == "scaled"
        assert reference.probe_once(("p", 1), probe("other"), fast="p: the fast kernel") == "scaled"  # cached
    with pytest.warns(RuntimeWarning, match=r"^p: the fast kernel does not reproduce transformers .*reference "
                                            r"implementation is used"):
        assert reference.probe_once(("p", 2), probe(None), fast="p: the fast kernel") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reference.probe_once(("p", 2), probe("scaled"), fast="p: the fast kernel") is None  # no second warning
    assert calls == ["scaled", None]


def test_engines_built_on_several_threads_probe_once(fresh):
    calls, started = [], threading.Barrier(8)

    def probe():
        calls.append(1)
        time.sleep(0.05)  # long enough for the other threads to ask meanwhile
        return "scaled"

    def build():
        started.wait()
        assert reference.probe_once("shared", probe, fast="p") == "scaled"

    threads = [threading.Thread(target=build) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1]
