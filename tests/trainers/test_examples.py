"""The examples run as scripts, and what they build is what the model and verl take."""

import importlib.util
import runpy
from pathlib import Path

import pytest
import torch
from cases import reference_rope_index, reference_verl_positions, tiny_model
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from mmrope_core.integrations.verl import as_verl_processor

EXAMPLES = Path(__file__).parents[2] / "examples"
# where each example runs; the Ray ones share the local Ray that test_ray.py starts
TESTED = {"data_collator": "here", "packed_varlen": "here", "own_trainer": "here", "verl_drop_in": "here",
          "ray_actors": "test_ray.py", "ray_data": "test_ray.py", "datasets_map": "test_datasets.py",
          "llamafactory_train": "test_launchers.py",
          "trl_padding_free": "tests/padding_free/test_trainers.py",  # where TRL is installed
          "sequence_parallel": "tests/test_parallel.py", "megatron_context_parallel": "here",
          "megatron_bridge_qwen_vl": "test_megatron_bridge.py"}


def example(name):
    spec = importlib.util.spec_from_file_location(f"mmrope_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_tested():
    assert {path.stem for path in EXAMPLES.glob("*.py")} == set(TESTED)


@pytest.mark.parametrize("name", [name for name, where in TESTED.items() if where == "here"])
def test_the_example_runs_as_a_script(name, capsys):
    runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name="__main__")
    assert capsys.readouterr().out.strip()


def test_the_megatron_examples_labels_are_the_next_tokens_of_the_same_sample():
    """Megatron's loss reads ``labels[i]`` as the token after ``tokens[i]`` (it shifts nothing):
    every token with a loss is followed by that label in its own sample, and a sample's last token
    (followed by padding or by the next sample) has none."""
    _, outputs, batch, _, params = example("megatron_context_parallel").main()
    tokens, labels, mask = batch["tokens"][0], batch["labels"][0], batch["loss_mask"][0].bool()
    held = mask.nonzero().flatten()
    assert held.numel() and torch.equal(labels[held], tokens[held + 1])
    ends = params.cu_seqlens_q_padded[:-1] + params.cu_seqlens_q.diff()  # one past each sample's last token
    assert not mask[ends - 1].any()
    assert int(mask.sum()) == int(params.cu_seqlens_q[-1]) - len(outputs)  # padding has no loss either


def model_logits(model, batch):
    keys = ("input_ids", "attention_mask", "position_ids", "pixel_values", "image_grid_thw", "mm_token_type_ids")
    with torch.no_grad():
        return model(**{key: batch[key] for key in keys if key in batch}, use_cache=False).logits


def test_the_collators_batch_gives_the_models_own_logits():
    _, _, batch = example("data_collator").main(count=4)
    model = tiny_model()
    valid = batch["attention_mask"].bool()
    own = model_logits(model, {key: value for key, value in batch.items() if key != "position_ids"})
    assert torch.equal(model_logits(model, batch)[valid], own[valid])
    with torch.no_grad():
        assert model(**{key: value for key, value in batch.items() if key != "mm_token_type_ids"}).loss.isfinite()
    # (B, 4, L) as returned by compute_position_ids, not transposed: with B = 4 it runs, and is wrong
    untransposed = {**batch, "position_ids": batch["position_ids"].transpose(0, 1)}
    assert batch["input_ids"].shape[0] == 4
    assert not torch.equal(model_logits(model, untransposed)[valid], own[valid])


def test_packed_segments_give_each_samples_logits_only_with_four_rows():
    _, outputs, packed, cu_seqlens = example("packed_varlen").main(count=3)
    model = tiny_model()
    logits = model_logits(model, packed)[0]
    three_rows = model_logits(model, {**packed, "position_ids": packed["position_ids"][1:]})[0]
    for index, output in enumerate(outputs):
        alone = model_logits(model, output)[0]
        segment = slice(int(cu_seqlens[index]), int(cu_seqlens[index + 1]))
        torch.testing.assert_close(logits[segment], alone)  # sdpa's packed mask: float sums in another order
        if index > 0:  # without the text row the model sees one sequence: later segments attend to earlier ones
            assert (three_rows[segment] - alone).abs().max() > 1e-3


def test_the_own_trainers_inputs_are_the_references_and_verls():
    engine, _, _, batch = example("own_trainer").main()
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    reference, _ = reference_rope_index("Qwen2.5-VL", input_ids, attention_mask,
                                        {"image_grid_thw": batch["image_grid_thw"]})
    assert torch.equal(batch["position_ids"][1:], reference)
    model = tiny_model()
    valid = attention_mask.bool()
    own = model_logits(model, {key: value for key, value in batch.items() if key != "position_ids"})
    assert torch.equal(model_logits(model, batch)[valid], own[valid])
    # verl's per-sample path with the drop-in gives each row's positions
    worker = type("Worker", (), {"processor": as_verl_processor(engine.processor, engine.config)})()
    start = engine.processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    images = batch["image_grid_thw"].split([int((row == start).sum()) for row in input_ids])  # each row's grids
    for row, grids in enumerate(images):
        n = int(attention_mask[row].sum())
        ids, mask = input_ids[row : row + 1, :n], attention_mask[row : row + 1, :n]
        verls = AgentLoopWorker._compute_position_ids(worker, ids, mask, {"image_grid_thw": grids})
        assert torch.equal(verls[0], batch["position_ids"][:, row, :n])
        assert torch.equal(verls, reference_verl_positions("Qwen2.5-VL", ids, mask, {"image_grid_thw": grids}))


def test_the_verl_example():
    position_ids = example("verl_drop_in").main()
    assert position_ids.shape[:2] == (1, 4)
