"""``generated_mask``: which tokens a rollout engine generated. The engine checks it like the other
inputs, hands it laid out as the ids to kernels that read it and to no other, and never changes
the caller's tensor; ``mmrope_core.rollout.decoded_positions`` against the rule written token by
token."""

import random

import pytest
import torch

from mmrope_core import InvalidInputError, RopeEngine
from mmrope_core.rollout import decoded_positions


@pytest.fixture
def toy():
    import mmrope_test_toy

    return mmrope_test_toy


def engine_of(toy, manager, kernel="decoding"):
    return RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=manager, kernel=kernel)


IDS = torch.tensor([[0, 7, 7, 7, 7], [7, 7, 7, 7, 7]])
MASK = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])


@pytest.mark.parametrize("generated, message", [
    ([[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], "generated_mask must be a torch.Tensor, got list"),
    (torch.zeros(2, 5), "generated_mask must be bool or integer 0/1 .* got dtype torch.float32"),
    (torch.zeros(2, 4, dtype=torch.long), r"generated_mask has shape \(2, 4\) but input_ids has \(2, 5\)"),
    (torch.tensor([[0, 0, 2, 0, 0], [0] * 5]), "generated_mask must hold only 0 and 1; sample 0, token 2 holds 2"),
    (torch.tensor([[0] * 5, [0, 0, 1, -1, 0]], dtype=torch.int8), "sample 1, token 3 holds -1"),
    (torch.tensor([[1, 0, 0, 0, 0], [0] * 5]), r"marks sample 0, token 0 as generated, but it is padding \(attention_mask 0\)"),
    (torch.tensor([[0, 1, 1, 0, 0], [0] * 5]), "marks the first token of sample 0 as generated; a rollout generates "
                                               "after a prompt"),
    (torch.tensor([[0, 0, 1, 0, 0], [1, 1, 0, 0, 0]]), "the first token of sample 1"),
    (torch.zeros(2, 5, dtype=torch.long, device="meta"), "generated_mask is on the meta device"),
])
@pytest.mark.parametrize("call", ["compute_position_ids", "get_rope_index"])
def test_a_bad_generated_mask_is_refused_by_what_and_where(toy_manager, toy, generated, message, call):
    engine = engine_of(toy, toy_manager)
    with pytest.raises(InvalidInputError, match=message):
        if call == "get_rope_index":
            engine.get_rope_index(IDS, MASK, generated_mask=generated)
        else:
            engine.compute_position_ids(IDS, MASK, {}, generated_mask=generated)


@pytest.mark.parametrize("packing, generated, message", [
    ("segment_ids", torch.tensor([[0, 0, 0, 1, 0, 0]]), r"the first token of a segment \(row 0, token 3\)"),
    ("segment_ids", torch.tensor([[0, 0, 0, 0, 0, 1]]), r"token 5 as generated, but it is padding \(segment_ids 0\)"),
    ("cu_seqlens", torch.tensor([[0, 0, 0, 1, 0, 0]]), r"the first token of a segment \(row 0, token 3\)"),
])
def test_packed_rows_refuse_it_at_segment_starts_and_outside_segments(toy_manager, toy, packing, generated, message):
    engine = engine_of(toy, toy_manager, "decoding, placing")
    ids = torch.tensor([[7] * 6])
    layout = {"segment_ids": torch.tensor([[1, 1, 1, 2, 2, 0]])} if packing == "segment_ids" else \
        {"cu_seqlens": torch.tensor([0, 3, 6])}
    with pytest.raises(InvalidInputError, match=message):
        engine.get_rope_index(ids, generated_mask=generated, **layout)


def test_a_kernel_that_reads_it_gets_it_as_a_bool_batch_and_the_caller_keeps_theirs(toy_manager, toy):
    engine = engine_of(toy, toy_manager)
    generated = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.int32)
    before = generated.clone()
    positions, _ = engine.get_rope_index(IDS, MASK, generated_mask=generated)
    given = engine.binding.kernel.generated[-1]
    assert given.dtype == torch.bool and torch.equal(given, before.bool())
    assert torch.equal(generated, before) and generated.dtype == torch.int32
    assert torch.equal(positions[0] >= 1000, before.bool())
    # (L,) for a single sample, like the ids; an all-0 mask is no mask
    engine.get_rope_index(IDS[1], generated_mask=torch.tensor([0, 0, 1, 1, 0]))
    assert engine.binding.kernel.generated[-1].shape == (1, 5)
    engine.get_rope_index(IDS, MASK, generated_mask=torch.zeros(2, 5, dtype=torch.bool))
    assert engine.binding.kernel.generated[-1] is None


@pytest.mark.parametrize("kernel", ["decoding", "decoding, placing"])
@pytest.mark.parametrize("packing", ["cu_seqlens", "segment_ids"])
def test_packed_rows_hand_it_over_joined_or_unpacked_and_back(toy_manager, toy, kernel, packing):
    """Segments of 3, 4 and 2 tokens (segment_ids: two rows, padding after each), generated
    tokens in the first two: the kernel's +1000 lands back on them."""
    engine = engine_of(toy, toy_manager, kernel)
    if packing == "cu_seqlens":
        ids, layout = torch.full((1, 9), 7), {"cu_seqlens": torch.tensor([0, 3, 7, 9])}
        generated = torch.tensor([[0, 1, 1, 0, 0, 1, 0, 0, 0]])
    else:
        ids = torch.full((2, 8), 7)
        layout = {"segment_ids": torch.tensor([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 0, 0, 0, 0, 0, 0]])}
        generated = torch.tensor([[0, 1, 1, 0, 0, 1, 0, 0], [0] * 8])
    positions, _ = engine.get_rope_index(ids, generated_mask=generated, **layout)
    assert torch.equal(positions[0] >= 1000, generated.bool())
    four = engine.compute_position_ids(ids, None, {}, generated_mask=generated, **layout)
    assert torch.equal(four[:, 1] >= 1000, generated.bool())
    given = engine.binding.kernel.generated[-1]
    if kernel == "decoding":  # unpacked: one segment a row
        assert given.tolist() == [[False, True, True, False], [False, False, True, False], [False] * 4]
    else:
        assert given.shape[0] == 1


def test_kernels_that_do_not_read_it_never_see_it_and_give_the_same(toy_manager, toy):
    engine = engine_of(toy, toy_manager, "counting")
    generated = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]])
    with_it = engine.get_rope_index(IDS, MASK, generated_mask=generated)
    without = engine.get_rope_index(IDS, MASK)
    assert all(torch.equal(a, b) for a, b in zip(with_it, without))
    assert torch.equal(engine.compute_position_ids(IDS, MASK, {}, generated_mask=generated),
                       engine.compute_position_ids(IDS, MASK, {}))
    assert all("generated_mask" not in ignored for ignored in engine.binding.kernel.ignored)


def test_1d_engines_check_it_and_count_every_token(toy_manager, toy):
    for engine in (RopeEngine.from_processor(None, plugin_manager=toy_manager),
                   RopeEngine.from_processor(toy.Toy1dProcessor(), plugin_manager=toy_manager)):
        generated = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]])
        assert torch.equal(engine.compute_position_ids(IDS, MASK, generated_mask=generated),
                           engine.compute_position_ids(IDS, MASK))
        with pytest.raises(InvalidInputError, match="generated_mask must hold only 0 and 1"):
            engine.compute_position_ids(IDS, MASK, generated_mask=generated * 3)


# -- decoded_positions: the rule, token by token ---------------------------------------------------

def rule(prefill, generated, valid):
    """Each sample (the valid tokens of a row, in order) as a rollout places it: a token the
    rollout generated at its index + trunc(largest position before its run + 1 - the run's first
    index), every other token at trunc(its prefill position); and the delta after the sample."""
    rows, length = generated.shape
    out = torch.zeros(prefill.shape, dtype=torch.int64)
    deltas = []
    for r in range(rows):
        columns = [c for c in range(length) if valid[r][c]]
        delta, largest = None, 0.0
        for index, c in enumerate(columns):
            if generated[r][c]:
                if index == 0 or not generated[r][columns[index - 1]]:
                    delta = int(float(largest) + 1 - index)  # truncated toward zero
                out[:, r, c] = index + delta
            else:
                out[:, r, c] = prefill[:, r, c].to(torch.int64)
            largest = max(largest, float(prefill[:, r, c].max()))
        last = columns[-1]
        deltas.append(delta if generated[r][last] else None)
    for r in range(rows):
        out[:, r, ~valid[r]] = prefill[:, r, ~valid[r]].to(torch.int64)
    return out, deltas


def random_sample(rng, length):
    """Positions counting on by 1 with jumps of fractional size (media), some going down on two
    rows (a grid's height and width); generated runs after the first token."""
    steps = torch.tensor([rng.choice([1.0, 1.0, 1.0, 0.5, 12.5, -3.0, 0.0]) for _ in range(length)])
    positions = steps.cumsum(0).clamp(min=0) + 0.5 * rng.randint(0, 1)
    prefill = torch.stack([positions, positions * 0.5, (positions - 2).clamp(min=0)])
    prefill[:, 0] = 0
    generated = torch.tensor([index > 0 and rng.random() < 0.4 for index in range(length)])
    return prefill.float(), generated


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_decoded_positions_follow_the_rule_in_padded_batches(dtype):
    """Padding on either side, and inside some samples."""
    rng = random.Random(f"decoded {dtype}")
    for index in range(40):
        rows, length = rng.randint(1, 4), rng.randint(2, 30)
        prefill = torch.zeros(3, rows, length)
        generated = torch.zeros(rows, length, dtype=torch.bool)
        valid = torch.zeros(rows, length, dtype=torch.bool)
        left = rng.random() < 0.5
        for r in range(rows):
            count = rng.randint(1, length)
            span = slice(length - count, length) if left else slice(0, count)
            prefill[:, r, span], generated[r, span] = random_sample(rng, count)
            valid[r, span] = True
            if rng.random() < 0.3:  # padding inside the sample, never where the rollout generated
                holes = [c for c in range(length)[span][1:] if not generated[r, c] and rng.random() < 0.2]
                valid[r, holes] = False
            prefill[:, r, ~valid[r]] = 1.0  # what padding holds does not matter
        if dtype == torch.int64:
            prefill = prefill.floor()
        prefill = prefill.to(dtype)
        want, want_deltas = rule(prefill, generated, valid)
        given = torch.full((rows, 1), 7.5)
        got, deltas = decoded_positions(prefill, generated, valid if not bool(valid.all()) else None, None, given)
        assert torch.equal(got, want), index
        assert deltas.tolist() == [[d if d is not None else 7] for d in want_deltas], index


def test_decoded_positions_restart_in_every_segment_of_a_packed_row():
    rng = random.Random("decoded packed")
    for index in range(40):
        lengths = [rng.randint(1, 12) for _ in range(rng.randint(1, 5))]
        parts = [random_sample(rng, n) for n in lengths]
        prefill = torch.cat([p for p, _ in parts], dim=1)[:, None]
        generated = torch.cat([g for _, g in parts])[None]
        bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        got, deltas = decoded_positions(prefill, generated, None, bounds, torch.zeros(len(lengths), 1))
        for k, (p, g) in enumerate(parts):
            want, want_delta = rule(p[:, None], g[None], torch.ones(1, lengths[k], dtype=torch.bool))
            assert torch.equal(got[:, 0, bounds[k]:bounds[k + 1]], want[:, 0]), (index, k)
            assert int(deltas[k, 0]) == (want_delta[0] if want_delta[0] is not None else 0), (index, k)


def test_decoded_positions_write_into_any_layout_and_leave_the_prefill():
    """A prompt of 3 tokens whose largest position is 1.5: its delta -0.5 truncates to 0, so the
    reply is decoded at 3 and 4, where a prefill truncates 2.5 and 3.5 to 2 and 3."""
    prefill = torch.tensor([0.0, 0.5, 1.5, 2.5, 3.5]).expand(3, 1, 5).clone()
    generated = torch.tensor([[False, False, False, True, True]])
    out = torch.empty(1, 4, 5, dtype=torch.int64)
    got, _ = decoded_positions(prefill, generated, out=out[:, 1:].transpose(0, 1))
    assert out[0, 1:].tolist() == [[0, 0, 1, 3, 4]] * 3 and got.data_ptr() == out[:, 1:].data_ptr()
    assert prefill[0, 0].tolist() == [0.0, 0.5, 1.5, 2.5, 3.5]
    assert decoded_positions(prefill, None)[0][0, 0].tolist() == [0, 0, 1, 2, 3]
