"""verl's agent loop, unchanged, takes its M-RoPE positions from mmrope's drop-in processor.

In a verl run the switch is one config entry; verl imports it in every process before it
builds the processor:

    actor_rollout_ref.model.external_lib=mmrope_core.integrations.verl.patch

Here, without a checkpoint: the tiny Qwen2.5-VL processor, a prompt holding a video of 2 s
per frame (timing that verl's own binding never hands to the model) and a response, laid out
as verl lays them out (prompt left-padded, response right-padded).

    python examples/verl_drop_in.py     (needs verl: make .venv-trainers/.installed)
"""

import torch
from transformers.models.qwen2_5_vl import Qwen2_5_VLModel
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from mmrope_core.integrations.verl import as_verl_processor
from mmrope_core.reference import config_only_model
from mmrope_qwen_vl.examples import build


def main():
    processor, config = build("Qwen2.5-VL")
    drop_in = as_verl_processor(processor, config)  # what hf_processor(path) returns for a checkpoint
    token = processor.tokenizer.convert_tokens_to_ids
    video = [token("<|vision_start|>"), *[token("<|video_pad|>")] * 16, token("<|vision_end|>")]  # 4 frames of 2x2
    prompt = [token("the"), token("cat"), *video, token("sat")]
    response = [token("on"), token("a"), token("mat")]
    pad = processor.tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * 4 + prompt + response + [pad] * 5])
    attention_mask = torch.tensor([[0] * 4 + [1] * (len(prompt) + len(response)) + [0] * 5])
    multi_modal_inputs = {"video_grid_thw": torch.tensor([[4, 4, 4]]), "second_per_grid_ts": torch.tensor([2.0]),
                          "mm_token_type_ids": torch.tensor(processor.create_mm_token_type_ids(input_ids.tolist()))}

    worker = type("Worker", (), {"processor": drop_in})()  # _compute_position_ids reads only .processor
    position_ids = AgentLoopWorker._compute_position_ids(worker, input_ids, attention_mask, dict(multi_modal_inputs))

    reference, _ = config_only_model(Qwen2_5_VLModel, config).get_rope_index(  # the model's own, with the timing
        input_ids, multi_modal_inputs["mm_token_type_ids"], video_grid_thw=multi_modal_inputs["video_grid_thw"],
        second_per_grid_ts=multi_modal_inputs["second_per_grid_ts"], attention_mask=attention_mask)
    assert torch.equal(position_ids[:, 1:], reference.transpose(0, 1))
    print(f"verl's _compute_position_ids with the drop-in: {tuple(position_ids.shape)}, equal to "
          f"Qwen2_5_VLModel.get_rope_index; temporal row {position_ids[0, 1, attention_mask[0].bool()].tolist()}")
    return position_ids


if __name__ == "__main__":
    main()
