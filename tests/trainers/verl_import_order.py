"""Run in a fresh process by ``test_verl_rollouts.py``: the drop-in made (or unpickled) before or
after verl's agent-loop module is imported, then verl's own post-processing of a Qwen3-Omni
trajectory sampled by SGLang, and of one by an engine mmrope has no convention for.

    python verl_import_order.py built-before-import
    python verl_import_order.py unpickled-before-import FILE
    python verl_import_order.py unpickled-after-import FILE
    python verl_import_order.py model-config-unpickled-before-import FILE

FILE holds a pickled drop-in, or verl's ``HFModelConfig`` holding one.
"""

import pickle
import sys

import torch

AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"


def drop_in(mode):
    if mode == "built-before-import":
        from mmrope_core.integrations.verl import as_verl_processor
        from mmrope_qwen3_omni.examples import build

        return as_verl_processor(*build("Qwen3-Omni"))
    with open(sys.argv[2], "rb") as file:
        loaded = pickle.load(file)
    return loaded.processor if type(loaded).__name__ == "HFModelConfig" else loaded


def trajectory(processor):
    """A prompt with a video of 4 frames of 48 tokens 0.5 s apart, then a reply, a tool's text and
    a reply: SGLang decodes each reply one position past where a prefill puts them."""
    tokenizer = processor.tokenizer
    word, other = tokenizer.convert_tokens_to_ids(["the", "cat"])
    video = [tokenizer.convert_tokens_to_ids(token) for token in
             [processor.vision_bos_token, *[processor.video_token] * 192, processor.vision_eos_token]]
    prompt, response = [word] * 3 + video + [word] * 3, [other] * 5 + [word] * 3 + [other] * 5
    return prompt, response, [1] * 5 + [0] * 3 + [1] * 5


def main(mode):
    processor = None if mode == "unpickled-after-import" else drop_in(mode)
    assert AGENT_LOOP not in sys.modules or mode == "unpickled-after-import"
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker
    from verl.utils.config import omega_conf_to_dataclass

    from mmrope_core import UnknownConventionError

    processor = processor or drop_in(mode)

    def worker(name):
        rollout = omega_conf_to_dataclass({"_target_": "verl.workers.config.RolloutConfig", "name": name,
                                           "prompt_length": 256, "response_length": 32})
        made = object.__new__(AgentLoopWorker)  # what verl's __init__ sets and post-processing reads
        made.rollout_config = rollout
        made.processor, made.tokenizer, made.mm_processor_kwargs = processor, processor.tokenizer, {}
        return made

    prompt, response, response_mask = trajectory(processor)
    input_ids = torch.tensor([prompt + response])
    attention_mask = torch.ones_like(input_ids)
    inputs = {"video_grid_thw": torch.tensor([[4, 16, 12]]), "video_second_per_grid": [0.5]}
    output = AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=response_mask,
                             multi_modal_data={}, metrics=AgentLoopMetrics())
    sglang = worker("sglang")
    sglang._compute_multi_modal_inputs(output, input_ids)
    got = sglang._compute_position_ids(input_ids, attention_mask, dict(inputs))
    engine = processor.rope_engine.with_convention("sglang")
    generated = torch.tensor([[0] * len(prompt) + response_mask])
    want = engine.compute_position_ids(input_ids, attention_mask, inputs, generated_mask=generated)
    transformers = processor.rope_engine.compute_position_ids(input_ids, attention_mask, inputs)
    assert torch.equal(got, want) and not torch.equal(got.double(), transformers.double()), mode
    try:
        worker("trtllm")
    except UnknownConventionError as error:
        assert "not 'trtllm' (actor_rollout_ref.rollout.name)" in str(error), error
    else:
        raise AssertionError(f"{mode}: a worker of a rollout engine mmrope does not know was accepted")
    print("followed the rollout")


if __name__ == "__main__":
    main(sys.argv[1])
