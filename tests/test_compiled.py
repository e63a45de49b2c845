"""``mmrope_core.compiled``, the public face of the compiled loops: availability and the statuses
``omni_positions`` documents."""

import numpy as np
import pytest

from mmrope_core import _native, compiled

# image, video, audio, vision start, vision end, audio start, audio end
TOKENS = (100, 101, 102, 103, 104, 105, 106)


def qwen2_5_positions(ids, mask=None, image_grid=None):
    """``omni_positions`` on a Qwen2.5-Omni batch (int64 positions), transformers' convention."""
    batch, length = ids.shape
    out, deltas = np.empty((3, batch, length), np.int64), np.empty((batch, 1), np.int64)
    status = compiled.omni_positions(out, False, batch, length, ids, mask, None, None, TOKENS,
                                     (False, False, image_grid is None, False), (2, 50, 0), 25.0, image_grid, None,
                                     None, None, deltas, 1)
    return status, out, deltas


@pytest.fixture
def loaded(monkeypatch):
    # the loops, even where MMROPE_DISABLE_COMPILED switched them off
    monkeypatch.setattr(compiled, "native", _native)


def test_available_says_whether_the_loops_are_loaded(monkeypatch):
    monkeypatch.setattr(compiled, "native", None)
    assert not compiled.available()
    with pytest.raises(RuntimeError, match="compiled loops are not loaded"):
        qwen2_5_positions(np.ones((1, 2), np.int64))
    monkeypatch.setattr(compiled, "native", _native)
    assert compiled.available()


def test_omni_positions_writes_or_says_why_not(loaded):
    status, out, deltas = qwen2_5_positions(np.ones((2, 4), np.int64), np.ones((2, 4), bool))
    assert status == compiled.OMNI_WRITTEN
    assert (out == np.arange(4)).all() and (deltas == 0).all()
    holes = np.array([[1, 0, 1, 1], [1, 1, 1, 1]], bool)
    assert qwen2_5_positions(np.ones((2, 4), np.int64), holes)[0] == compiled.OMNI_PADDING_INSIDE
    image = np.array([[1, 103, 100, 104]], np.int64)
    assert qwen2_5_positions(image, image_grid=np.array([[1, 2, 2]], np.int64))[0] == compiled.OMNI_WRITTEN
    assert qwen2_5_positions(image, image_grid=np.array([[1, 4, 4]], np.int64))[0] == compiled.OMNI_MISMATCH


def test_omni_positions_refuses_arrays_that_do_not_fit(loaded):
    with pytest.raises(ValueError, match="sizes do not fit"):
        qwen2_5_positions(np.ones((2, 4), np.int64), np.ones((2, 3), bool))
