"""``mmrope_core.compiled``, the public face of the compiled loops: whether they are loaded, and
switching them off for the calls that have numpy paths of their own."""

import numpy as np

from mmrope_core import compiled
from mmrope_core.items import GridMedia, ItemKind, ItemLayout


def test_available_says_whether_the_loops_are_loaded(monkeypatch):
    loaded = compiled.native
    monkeypatch.setattr(compiled, "native", None)
    assert not compiled.available()
    monkeypatch.setattr(compiled, "native", loaded)
    assert compiled.available() is (loaded is not None)


def test_the_variable_switches_the_loops_off(monkeypatch):
    monkeypatch.setenv(compiled.DISABLE_VARIABLE, "1")
    assert compiled._load() is None


def test_switched_off_runs_the_calls_inside_on_their_numpy_paths(monkeypatch):
    calls = []

    class Loops:
        def place_items(self, *args):
            calls.append("compiled")
            return 0

        def compile_layout(self, *args):
            return object()

    monkeypatch.setattr(compiled, "native", Loops())
    layout = ItemLayout(media=(GridMedia("image", 2),), kinds=(ItemKind("image", (1, 2), ("image",), (2,), (3,)),))
    ids = np.array([[5, 1, 2, 3]], dtype=np.int64)
    arguments = (np.empty((3, 1, 4), np.int64), False, ids, None, None, None, (np.array([[1, 2, 2]]),), (None,),
                 np.empty((1, 1), np.int64), 1)
    assert layout.place(*arguments) == 0 and calls == ["compiled"]
    with compiled.switched_off():
        assert not compiled.available()
        assert layout.place(*arguments) == 0 and calls == ["compiled"]  # numpy placed it
    assert compiled.available()
