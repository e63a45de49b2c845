"""``mmrope_core.compiled``, the public face of the compiled loops: whether they are loaded, the
calls that take numpy paths without them, and the item primitives called directly (layouts as
the extension takes them, the statuses it returns, the arrays it refuses)."""

import multiprocessing

import numpy as np
import pytest

from mmrope_core import _compiled, compiled

loops = pytest.mark.mmrope_applies(_compiled.native is not None, "the compiled loops")

OPEN, IMAGE, CLOSE = 103, 100, 104
# one grid medium merged 2 x 2; images between two markers; int64 positions, whole-second temporal ids
MEDIA = ((0, 2, False, (), 0, 0),)
KIND = ((OPEN, IMAGE), 1, (0,), (IMAGE,), (CLOSE,), None, False, 1, 0, 0, False, 0)
TEMPORAL, VALUES = (1.0, False, 1, True), (False, 1.0, False, False, True)


def place(layout, ids, mask=None, grid=None, out=None):
    batch, length = ids.shape
    out = np.empty((3, batch, length), np.int64) if out is None else out
    deltas = np.empty((batch, 1), np.int64)
    status = _compiled.native.place_items(layout, out, False, batch, length, ids, mask, None, None, (grid,), (None,),
                                          deltas, 1, 1)
    return status, out, deltas


def test_available_says_whether_the_loops_are_loaded(monkeypatch):
    monkeypatch.setattr(compiled, "native", None)
    assert not compiled.available()
    monkeypatch.setattr(compiled, "native", _compiled.native)
    assert compiled.available() is (_compiled.native is not None)


@loops
def test_place_items_writes_or_says_why_not():
    layout = _compiled.native.compile_layout(MEDIA, (KIND,), TEMPORAL, VALUES)
    status, out, deltas = place(layout, np.ones((2, 4), np.int64), np.ones((2, 4), bool))
    assert status == 0 and (out == np.arange(4)).all() and (deltas == 0).all()
    holes = np.array([[1, 0, 1, 1], [1, 1, 1, 1]], bool)
    assert place(layout, np.ones((2, 4), np.int64), holes)[0] == 2
    image = np.array([[1, OPEN, IMAGE, CLOSE]], np.int64)
    status, out, deltas = place(layout, image, grid=np.array([[1, 2, 2]], np.int64))
    assert status == 0 and out[:, 0].tolist() == [[0, 1, 2, 3]] * 3 and deltas.tolist() == [[0]]
    assert place(layout, image, grid=np.array([[1, 4, 4]], np.int64))[0] == 1
    assert place(layout, image, grid=np.array([[1, 2, 3]], np.int64))[0] == 3
    assert place(layout, np.ones((2, 4), np.int64), np.array([[1, 1, 1, 1], [0, 0, 0, 0]], bool))[0] == 4
    status, sample, token, items = _compiled.native.find_items(layout, 1, 4, image, None, None, None,
                                                               (np.array([[1, 2, 2]], np.int64),), (None,), 1)
    assert (status, sample, token) == (0, -1, 0)
    assert np.frombuffer(items, np.int64).tolist() == [0, 1, 3, 0, 0, -1]


@loops
@pytest.mark.parametrize("media, kinds, temporal, values, message", [
    (((0, 0, False, (), 0, 0),), (), TEMPORAL, VALUES, "a medium out of range"),
    (((1, 1, False, ((1, 0),), 0, 0),), (), TEMPORAL, VALUES, "a medium out of range"),
    (MEDIA, (KIND[:2] + ((1,),) + KIND[3:],), TEMPORAL, VALUES, "a kind out of range"),
    (MEDIA, (KIND[:7] + (2,) + KIND[8:],), TEMPORAL, VALUES, "a kind out of range"),
    (MEDIA, (KIND,), (1.0, False, 2, True), VALUES, "a rule out of range"),
    (MEDIA, (KIND,), (float("inf"), False, 1, True), VALUES, "a rule out of range"),
    (MEDIA, (KIND,), (1.0, False, 1, False), VALUES, "a rule out of range"),
    (MEDIA, ((tuple(range(5)),) + KIND[1:],), TEMPORAL, VALUES, "a key is a tuple of at most 4"),
])
def test_compile_layout_refuses_a_layout_out_of_range(media, kinds, temporal, values, message):
    with pytest.raises(ValueError, match=message):
        _compiled.native.compile_layout(media, kinds, temporal, values)


@loops
def test_place_items_refuses_arrays_that_do_not_fit_or_cannot_be_written():
    layout = _compiled.native.compile_layout(MEDIA, (KIND,), TEMPORAL, VALUES)
    with pytest.raises(ValueError, match="sizes do not fit"):
        place(layout, np.ones((2, 4), np.int64), np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="do not fit"):
        place(layout, np.ones((2, 4), np.int64), out=np.empty((3, 2, 5), np.int64))
    read_only = np.empty((3, 1, 4), np.int64)
    read_only.flags.writeable = False
    with pytest.raises((ValueError, BufferError), match="read-only"):
        place(layout, np.ones((1, 4), np.int64), out=read_only)
    with pytest.raises(ValueError, match="PyCapsule"):
        place(object(), np.ones((1, 4), np.int64))


def in_a_forked_child(_):
    layout = _compiled.native.compile_layout(MEDIA, (KIND,), TEMPORAL, VALUES)
    ids = np.tile(np.array([1, OPEN, IMAGE, CLOSE], np.int64), (64, 2048))
    grid = np.tile(np.array([[1, 2, 2]], np.int64), (64 * 2048, 1))
    batch, length = ids.shape
    out, deltas = np.empty((3, batch, length), np.int64), np.empty(batch, np.int64)
    status = _compiled.native.place_items(layout, out, False, batch, length, ids, None, None, None, (grid,), (None,),
                                          deltas, 1, 8)
    return status, int(out[:, -1, -1].sum())


@loops
def test_a_forked_process_places_items_on_threads_of_its_own():
    """Data-loader workers fork the trainer: the threads of a call are gone when it returns."""
    in_parent = in_a_forked_child(None)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(in_a_forked_child, (None,)).get(timeout=120) == in_parent
