"""The engine with real entry-point plugins: binding, hooks, errors, layouts, pickling."""

import dataclasses
import pickle
import re

import pytest
import torch

from mmrope_core import (
    InvalidInputError,
    PluginConflictError,
    PluginContractError,
    PluginHookError,
    PluginLoadWarning,
    RopeEngine,
    RopeIndexUnavailableError,
    UnsupportedProcessorError,
    hookimpl,
)


@pytest.fixture
def toy():
    import mmrope_test_toy

    return mmrope_test_toy


def test_a_processor_no_plugin_claims_names_its_class_and_the_plugins(make_manager):
    manager = make_manager(MMROPE_LOAD_PLUGINS="toy,broken_import")

    class MysteryProcessor:
        pass

    with pytest.warns(PluginLoadWarning):
        with pytest.raises(UnsupportedProcessorError) as caught:
            RopeEngine.from_processor(MysteryProcessor(), plugin_manager=manager)
    message = str(caught.value)
    assert "no installed mmrope plugin handles MysteryProcessor" in message
    assert "toy (mmrope-test-plugins 1.0)" in message
    assert "Failed to load: broken_import (mmrope-test-plugins 1.0): ModuleNotFoundError" in message
    assert "No config was given" in message
    with pytest.raises(UnsupportedProcessorError) as caught:
        RopeEngine.from_processor(MysteryProcessor(), object(), plugin_manager=manager)
    assert "No config was given" not in str(caught.value)


def test_text_only_engine_gives_1d_positions(toy_manager):
    engine = RopeEngine.from_processor(None, plugin_manager=toy_manager)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    positions = engine.compute_position_ids(torch.ones(2, 5, dtype=torch.long), mask)
    assert engine.rope_kind == "1d" and engine.plugin_name is None
    assert positions.tolist() == (mask.cumsum(1) - 1).clamp(min=0).tolist()
    with pytest.raises(RopeIndexUnavailableError, match="compute_position_ids"):
        engine.get_rope_index(torch.ones(1, 3, dtype=torch.long))


def test_a_1d_plugin_binding_gives_2d_positions(toy_manager, toy):
    engine = RopeEngine.from_processor(toy.Toy1dProcessor(), plugin_manager=toy_manager)
    positions = engine.compute_position_ids(torch.tensor([5, 6, 7]), None)
    assert engine.plugin_name == "toy"
    assert positions.dtype == torch.int64 and positions.tolist() == [[0, 1, 2]]


def test_mrope_layout_is_text_row_then_the_plugins_three_rows(toy_manager, toy):
    engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)
    ids = torch.tensor([[0, 0, 7, 7, 7], [7, 7, 7, 7, 0]])
    mask = ids != 0
    positions = engine.compute_position_ids(ids, mask.long(), {"offset": torch.tensor(5)})
    assert positions.shape == (2, 4, 5) and positions.dtype == torch.int64
    assert positions[0, 0].tolist() == [1, 1, 0, 1, 2]  # text row: 1 at padding
    assert positions[1, 0].tolist() == [0, 1, 2, 3, 1]
    expected, _ = toy.toy_rope_index(ids, mask, offset=5)
    assert torch.equal(positions[:, 1:], expected.transpose(0, 1))


def engine_of(toy, manager, kernel="counting", **options):
    return RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=manager, kernel=kernel, **options)


def test_a_kernels_own_position_ids_give_the_layout_in_one_call(toy_manager, toy):
    composed, direct = engine_of(toy, toy_manager), engine_of(toy, toy_manager, "direct")
    ids = torch.tensor([[0, 0, 7, 7, 7], [7, 7, 7, 7, 0]])
    for mask in (ids != 0, (ids != 0).long(), None):
        got = direct.compute_position_ids(ids, mask, {"offset": torch.tensor(5)})
        assert torch.equal(got, composed.compute_position_ids(ids, mask, {"offset": torch.tensor(5)}))
    assert [call[0] for call in direct.binding.kernel.calls] == ["position_ids"] * 3
    packed = direct.compute_position_ids(torch.full((1, 5), 7), None, {}, cu_seqlens=torch.tensor([0, 2, 5]))
    assert direct.binding.kernel.calls[-1][:2] == ("position_ids", [0, 2, 5]) and packed[0, 0].tolist() == [0, 1, 0, 1, 2]


@pytest.mark.parametrize("call, message", [
    (lambda engine: engine.compute_position_ids(torch.tensor([[7, 7]]), None, {}),
     r"position_ids of plugin toy \(mmrope-test-plugins 1.0\) returned a torch.int64 tensor of shape \(1, 3, 2\); "
     r"expected a torch.int64 tensor of shape \(1, 4, 2\)"),
    (lambda engine: engine.get_rope_index(torch.full((1, 5), 7), cu_seqlens=torch.tensor([0, 2, 5])),
     r"rope_index of plugin toy \(mmrope-test-plugins 1.0\) returned \(a torch.int64 tensor of shape \(1, 5\), "
     r"a torch.int64 tensor of shape \(1, 1\)\); expected positions of shape \(3, 1, 5\) and deltas of shape \(2, 1\)"),
])
def test_kernel_results_of_the_wrong_shape_break_the_contract(toy_manager, toy, call, message):
    with pytest.raises(PluginContractError, match=r"^the kernel's " + message):
        call(engine_of(toy, toy_manager, "misshapen"))


def test_kernel_results_of_the_wrong_dtype_break_the_contract(toy_manager, toy):
    engine = engine_of(toy, toy_manager, "int32")
    with pytest.raises(PluginContractError, match=r"^the kernel's position_ids of plugin toy \(mmrope-test-plugins 1.0\) "
                                                  r"returned a torch.int32 tensor of shape \(1, 4, 5\); expected a "
                                                  r"torch.int64 tensor of shape \(1, 4, 5\)"):
        engine.compute_position_ids(torch.full((1, 5), 7), None, {}, cu_seqlens=torch.tensor([0, 2, 5]))


def test_rope_index_results_that_do_not_hold_positions_exactly_break_the_contract(toy_manager, toy):
    engine = engine_of(toy, toy_manager, "half")
    with pytest.raises(PluginContractError, match=r"^the kernel's rope_index of plugin toy \(mmrope-test-plugins 1.0\) "
                                                  r"returned \(a torch.float16 tensor of shape \(3, 1, 5\), a torch.bool "
                                                  r"tensor of shape \(1, 1\)\); expected .* integer, float32 or float64"):
        engine.get_rope_index(torch.full((1, 5), 7))


def test_results_on_another_device_than_the_tokens_break_the_contract(toy_manager, toy):
    engine = engine_of(toy, toy_manager, "elsewhere")
    with pytest.raises(PluginContractError, match=r"rope_index of plugin toy .*expected .* tensors on cpu"):
        engine.get_rope_index(torch.full((1, 5), 7))
    with pytest.raises(PluginContractError, match=r"position_ids of plugin toy .*expected a torch.int64 tensor of "
                                                  r"shape \(1, 4, 5\) on cpu"):
        engine.compute_position_ids(torch.full((1, 5), 7), None, {})


def test_a_kernel_that_raises_names_the_plugin(toy_manager, toy):
    engine = engine_of(toy, toy_manager, "raising")
    with pytest.raises(PluginHookError, match=r"^plugin toy \(mmrope-test-plugins 1.0\) raised in the kernel's "
                                              r"rope_index: ValueError: no positions today") as caught:
        engine.get_rope_index(torch.full((1, 3), 7))
    assert isinstance(caught.value.__cause__, ValueError)


def test_packed_rows_go_to_the_kernel_joined_when_it_places_them(toy_manager, toy):
    placing, unpacking = engine_of(toy, toy_manager, "placing"), engine_of(toy, toy_manager)
    ids, inputs = torch.full((1, 9), 7), {"offset": torch.tensor(2)}
    for cu_seqlens in (torch.tensor([0, 2, 7, 9]), torch.tensor([0, 3, 6, 9])):
        got = placing.compute_position_ids(ids, None, inputs, cu_seqlens=cu_seqlens)
        assert torch.equal(got, unpacking.compute_position_ids(ids, None, inputs, cu_seqlens=cu_seqlens))
        got = placing.get_rope_index(ids, cu_seqlens=cu_seqlens, offset=2)
        want = unpacking.get_rope_index(ids, cu_seqlens=cu_seqlens, offset=2)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert [call[1] for call in placing.binding.kernel.calls] == [[0, 2, 7, 9]] * 2 + [[0, 3, 6, 9]] * 2
    # a kernel that does not place packed rows gets the segments as a batch, padded where they differ
    shapes = [(call[1], None if call[2] is None else tuple(call[2].shape)) for call in unpacking.binding.kernel.calls]
    assert shapes == [(None, (3, 5))] * 2 + [(None, None)] * 2
    # segment ids over two rows are joined into one row of their segments' tokens
    segment_ids = torch.tensor([[1, 1, 2, 2, 0], [1, 2, 2, 2, 3]])
    got = placing.compute_position_ids(torch.full((2, 5), 7), None, inputs, segment_ids=segment_ids)
    assert torch.equal(got, unpacking.compute_position_ids(torch.full((2, 5), 7), None, inputs, segment_ids=segment_ids))
    assert placing.binding.kernel.calls[-1][1] == [0, 2, 4, 5, 8, 9]
    assert got[0, :, 4].tolist() == [1, 0, 0, 0]  # a token outside every segment


def test_packed_results_laid_out_in_any_order_in_memory_are_taken(toy_manager, toy):
    strided, unpacking = engine_of(toy, toy_manager, "strided"), engine_of(toy, toy_manager)
    ids, inputs = torch.full((2, 5), 7), {"offset": torch.tensor(2)}
    segment_ids = torch.tensor([[1, 1, 2, 2, 2], [1, 2, 2, 2, 3]])
    got = strided.compute_position_ids(ids, None, inputs, segment_ids=segment_ids)
    assert got.is_contiguous()
    assert torch.equal(got, unpacking.compute_position_ids(ids, None, inputs, segment_ids=segment_ids))
    got = strided.get_rope_index(ids, segment_ids=segment_ids, offset=torch.tensor(2))
    want = unpacking.get_rope_index(ids, segment_ids=segment_ids, offset=torch.tensor(2))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_mask_reaches_the_kernel_unless_every_token_is_valid(toy_manager, toy):
    engine = engine_of(toy, toy_manager)
    ids = torch.full((2, 5), 7)
    hole = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 1, 1]])  # every row's first and last token valid
    for mask in (hole, hole.bool(), torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.bool), None):
        positions, _ = engine.get_rope_index(ids, mask)
        assert torch.equal(positions, toy.toy_rope_index(ids, mask.bool() if mask is not None else None)[0])
    seen = [call[2] for call in engine.binding.kernel.calls]
    assert torch.equal(seen[0], hole.bool()) and torch.equal(seen[1], hole.bool())
    assert seen[2:] == [None, None, None]


def test_get_rope_index_is_a_drop_in(toy_manager, toy):
    engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)
    positions, deltas = engine.get_rope_index(torch.tensor([[7, 7, 7]]), offset=2, mm_token_type_ids="ignored")
    assert positions.shape == (3, 1, 3) and deltas.shape == (1, 1)
    assert positions[0, 0].tolist() == [2, 3, 4]


def test_options_reach_the_plugin(toy_manager, toy):
    engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager, implementation="reference")
    assert engine.implementation == "reference"


def test_an_option_the_plugin_does_not_read_is_refused(toy_manager, toy):
    from mmrope_core import UnknownOptionError

    with pytest.raises(UnknownOptionError, match=r"option 'implementaton' is not known to plugin toy \(mmrope-test-"
                                                 r"plugins 1.0\), which binds ToyProcessor; the options it reads: "
                                                 r"'implementation', 'kernel'"):
        RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager, implementaton="reference")
    with pytest.raises(UnknownOptionError, match="option 'implementaton' is not known to a text-only engine"):
        RopeEngine.from_processor(None, plugin_manager=toy_manager, implementaton="reference")
    assert RopeEngine.from_processor(None, plugin_manager=toy_manager, implementation="reference").rope_kind == "1d"


def test_an_option_read_by_a_plugin_that_declines_is_still_unknown_to_the_binder(toy_manager, toy):
    from mmrope_core import UnknownConventionError, UnknownOptionError

    class Curious:
        @hookimpl(tryfirst=True)
        def bind_rope_index(self, processor, config, options):
            options.get("fancy_option"), options.get("convention")  # asks, then declines

    class PassingOn:
        @hookimpl(wrapper=True)
        def bind_rope_index(self, processor, config, options):
            return (yield)

    class Replacing:
        @hookimpl(wrapper=True)
        def bind_rope_index(self, processor, config, options):
            return dataclasses.replace((yield), description="wrapped")

    class OldStyle:
        @hookimpl(hookwrapper=True)
        def bind_rope_index(self, processor, config, options):
            outcome = yield
            outcome.force_result(dataclasses.replace(outcome.get_result(), description="forced"))

    with toy_manager.registered(Curious(), "curious"):
        with pytest.raises(UnknownOptionError, match=r"option 'fancy_option' is not known to plugin toy .*the "
                                                     r"options it reads: 'implementation', 'kernel'"):
            RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager, fancy_option=1)
        with pytest.raises(UnknownConventionError):
            RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager, convention="vllm")
    for wrapper in (PassingOn(), Replacing(), OldStyle()):  # the binder's reads count through a wrapper
        with toy_manager.registered(wrapper, "wrapping"):
            engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager, kernel="direct")
            assert type(engine.binding.kernel).__name__ == "DirectKernel"  # option kernel= read by toy, accepted


def test_kwargs_hooks_cannot_change_the_callers_data(toy_manager, toy):
    class Mutating:
        @hookimpl
        def get_rope_index_kwargs(self, multi_modal_inputs):
            multi_modal_inputs["offset"].add_(100)
            with pytest.raises(TypeError):
                multi_modal_inputs["offset"] = 0
            return None

    offset = torch.tensor(3)
    inputs = {"offset": offset}
    with toy_manager.registered(Mutating(), "mutating"):
        engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)
        engine.compute_position_ids(torch.tensor([[7, 7]]), None, inputs)
    assert offset.item() == 3 and inputs == {"offset": offset}


def test_a_hook_raising_names_the_plugin_the_distribution_and_the_hook(make_manager, toy):
    manager = make_manager(MMROPE_LOAD_PLUGINS="toy,raises")
    engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=manager)
    with pytest.raises(PluginHookError) as caught:
        engine.compute_position_ids(torch.tensor([[7, 7]]), None, {})
    assert "raises (mmrope-test-plugins 1.0) raised in hook get_rope_index_kwargs: ZeroDivisionError" in str(caught.value)
    assert isinstance(caught.value.__cause__, ZeroDivisionError)


def test_two_plugins_giving_different_values_conflict(make_manager, toy):
    manager = make_manager(MMROPE_LOAD_PLUGINS="toy,conflict_a,conflict_b")
    engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=manager)
    with pytest.raises(PluginConflictError) as caught:
        engine.compute_position_ids(torch.tensor([[7, 7]]), None, {})
    message = str(caught.value)
    assert "conflict_a (mmrope-test-plugins 1.0)" in message and "conflict_b (mmrope-test-plugins 1.0)" in message
    assert "'offset'" in message


def test_two_plugins_giving_the_same_value_agree(make_manager, toy):
    manager = make_manager(MMROPE_LOAD_PLUGINS="toy,conflict_a")
    engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=manager)
    positions = engine.compute_position_ids(torch.tensor([[7, 7]]), None, {"offset": 10})
    assert positions[0, 1].tolist() == [10, 11]


def test_a_hook_returning_the_wrong_type_breaks_the_contract(toy_manager):
    class Wrong:
        @hookimpl
        def bind_rope_index(self, processor):
            return {"kind": "mrope"}

    with toy_manager.registered(Wrong(), "wrong"):
        with pytest.raises(PluginContractError, match="wrong .*returned dict from bind_rope_index; expected a RopeBinding"):
            RopeEngine.from_processor(object(), plugin_manager=toy_manager)


def test_varlen_keys_are_the_union_and_collate_pads_them(toy_manager, toy):
    class MoreKeys:
        @hookimpl
        def varlen_keys(self, processor):
            return {"more"}

    with toy_manager.registered(MoreKeys(), "more_keys"):
        engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)
    assert engine.varlen_keys == {"features", "more"}
    batch = engine.collate([{"features": torch.ones(1, 2, 3)}, {"features": torch.ones(1, 2, 5)}])
    assert batch["features"].shape == (2, 2, 5)
    assert batch["features"][0, :, 3:].eq(0).all() and batch["features"][1].eq(1).all()


def test_a_plugins_batch_layout_reaches_batch_and_collate(toy_manager, toy):
    from mmrope_core import BatchLayout, MediaKey

    class Strips:
        @hookimpl
        def batch_layout(self, processor):
            return BatchLayout(media={"strip": MediaKey(join="last")})

    class Wrong:
        @hookimpl
        def batch_layout(self, processor):
            return {"strip": "last"}

    with toy_manager.registered(Strips(), "strips"):
        engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)
    samples = [{"input_ids": torch.tensor([[1, 2]]), "strip": torch.ones(1, 3, width)} for width in (2, 5)]
    assert engine.collate([{"strip": sample["strip"]} for sample in samples])["strip"].shape == (1, 3, 7)
    assert engine.batch(samples)[2]["strip"].shape == (1, 3, 7)
    with toy_manager.registered(Wrong(), "wrong"):
        with pytest.raises(PluginContractError, match="wrong .*returned dict from batch_layout; expected a BatchLayout"):
            RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)


def test_process_applies_the_policy_to_a_copy(toy_manager, toy):
    processor = toy.ToyProcessor()
    engine = RopeEngine.from_processor(processor, plugin_manager=toy_manager)
    with pytest.raises(ValueError, match="even number"):
        processor(text=["a b c"])
    out = engine.process(text=["a b c"])
    assert out["input_ids"].shape == (1, 3)
    assert "validate_inputs" not in vars(processor)
    with pytest.raises(ValueError, match="even number"):
        processor(text=["a b c"])
    with pytest.raises(ValueError, match="needs text"):
        engine.process(text=[])
    assert engine.validation_policy.reason


def test_the_engine_pickles(toy_manager, toy, monkeypatch):
    import mmrope_core.manager

    monkeypatch.setattr(mmrope_core.manager, "_default_manager", toy_manager)
    engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)
    clone = pickle.loads(pickle.dumps(engine))
    ids = torch.tensor([[7, 7, 0]])
    assert clone.plugin_name == "toy"
    assert torch.equal(clone.compute_position_ids(ids, ids != 0), engine.compute_position_ids(ids, ids != 0))


@pytest.mark.parametrize(
    "input_ids, attention_mask, message",
    [
        ([[1, 2]], None, "input_ids must be a torch.Tensor, got list"),
        (torch.ones(1, 2), None, "integer token ids, got dtype torch.float32"),
        (torch.ones(1, 2, 3, dtype=torch.long), None, r"shape \(L,\) or \(B, L\), got \(1, 2, 3\)"),
        (torch.ones(0, 4, dtype=torch.long), None, "input_ids is empty"),
        (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 4), r"attention_mask has shape \(2, 4\) but input_ids has \(2, 3\)"),
        (torch.ones(1, 3, dtype=torch.long), torch.tensor([[1, 2, 1]]), "sample 0, position 1 holds 2"),
        (torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 1], [2, 1, 1]]), "sample 1, position 0 holds 2"),
        (torch.ones(1, 3, dtype=torch.long), torch.tensor([[1, -1, 1]]), "sample 0, position 1 holds -1"),
        (torch.ones(1, 3, dtype=torch.long), torch.tensor([[0, 257, 0]]), "sample 0, position 1 holds 257"),
        (torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3) * 0.5, "bool or integer 0/1"),
        (torch.ones(2, 2, dtype=torch.long), torch.tensor([[1, 1], [0, 0]]), "sample 1 has no valid token"),
    ],
)
def test_bad_inputs_raise_typed_errors(toy_manager, toy, input_ids, attention_mask, message):
    engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)
    with pytest.raises(InvalidInputError, match=message):
        engine.compute_position_ids(input_ids, attention_mask, {})


@pytest.mark.parametrize("key", [0, 1.5, ("image_grid_thw",), b"image_grid_thw"])
def test_a_key_that_is_not_a_string_is_refused_naming_it_and_the_sample(toy_manager, toy, key):
    from mmrope_core.processor_outputs import collate
    from mmrope_core.collators import PackedCollator, PaddedCollator
    from mmrope_core.media import read_media

    from transformers import LlamaConfig  # (packed rows need the model's config)

    engine = RopeEngine.from_processor(toy.ToyProcessor(), LlamaConfig(num_attention_heads=2),
                                       plugin_manager=toy_manager)
    ids = torch.ones(1, 3, dtype=torch.long)
    named = rf"has the key {re.escape(repr(key))} \({type(key).__name__}\); keys must be strings"
    calls = {
        "multi_modal_inputs": lambda: engine.compute_position_ids(ids, None, {key: ids}),
        "mm_processor_kwargs": lambda: engine.rope_index_kwargs({}, {key: True}),
        "the multimodal inputs": lambda: read_media({key: ids}, {}),
        "sample 1": lambda: collate([{"pixel_values": ids}, {key: ids}]),
    }
    for sample in (lambda: engine.batch([{"input_ids": ids}, {"input_ids": ids, key: ids}]),
                   lambda: PaddedCollator(engine)([{"input_ids": ids}, {"input_ids": ids, key: ids}]),
                   lambda: PackedCollator(engine)([{"input_ids": ids}, {"input_ids": ids, key: ids}])):
        with pytest.raises(InvalidInputError, match="sample 1 " + named):
            sample()
    for where, call in calls.items():
        with pytest.raises(InvalidInputError, match=re.escape(where) + " " + named):
            call()


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16])
def test_narrow_ids_reach_the_kernel_as_int64_so_positions_never_wrap(toy_manager, toy, dtype):
    engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)
    ids = torch.full((1, 300), 7, dtype=dtype)
    positions, _ = engine.get_rope_index(ids)
    want, _ = engine.get_rope_index(ids.long())
    assert positions.dtype == torch.int64 and torch.equal(positions, want)
    assert int(positions.max()) == 299 and ids.dtype == dtype


@pytest.mark.parametrize("packing", ["cu_seqlens", "segment_ids"])
def test_packing_tensors_without_values_are_refused_by_name(toy_manager, toy, packing):
    engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager)
    value = torch.tensor([0, 3], device="meta") if packing == "cu_seqlens" else torch.ones(1, 3, device="meta")
    with pytest.raises(InvalidInputError, match=f"{packing} is on the meta device, which holds no values"):
        engine.compute_position_ids(torch.tensor([[7, 7, 7]]), None, {}, **{packing: value})


def test_convention_none_is_the_default_wherever_a_convention_is_taken(toy_manager, toy):
    """``convention=None`` means transformers' positions: the engine, a plugin that never reads a
    convention, a text-only engine, the collators and the helpers plugins call."""
    from mmrope_core import conventions
    from mmrope_core.collators import PackedCollator, PaddedCollator
    from mmrope_qwen_vl.examples import build

    processor, config = build("Qwen2-VL")
    default = RopeEngine.from_processor(processor, config, plugin_manager=toy_manager)
    given = RopeEngine.from_processor(processor, config, plugin_manager=toy_manager, convention=None)
    assert given.convention == default.convention == "transformers"
    assert given.binding.description == default.binding.description
    ids = torch.tensor([[processor.tokenizer.convert_tokens_to_ids("the")] * 5])
    assert torch.equal(given.compute_position_ids(ids, None, {}), default.compute_position_ids(ids, None, {}))
    toy_engine = RopeEngine.from_processor(toy.ToyProcessor(), plugin_manager=toy_manager, convention=None)
    assert toy_engine.convention == "transformers"
    assert RopeEngine.from_processor(None, plugin_manager=toy_manager, convention=None).rope_kind == "1d"
    for collator in (PaddedCollator, PackedCollator):
        assert collator(default, convention=None).engine is default
    assert conventions.asked({"convention": None}) == "transformers"
    assert conventions.convention({"convention": None}, "a family", ("transformers",)) == "transformers"
