"""Qwen3-Omni audio-in-video positions: transformers reference vs mmrope's fast implementation on
one 1 x 32768 sample (a long video with its audio interleaved). Prints the ratio measured in this
run (machines are noisy: compare ratios, not times).

    python benchmarks/qwen_omni.py [--repeat 3]
"""

from __future__ import annotations

import argparse

import torch

from mmrope_qwen3_omni.examples import build
from mmrope_qwen3_omni.rope import qwen3_audio_tokens, token_ids
from timing import engine, environment, timed


def audio_in_video_sample(processor, thinker, total=32768):
    """Text, then one video (64 frames of 28 x 28 patches) with its audio, then text: ``total`` tokens."""
    ids = token_ids(processor)
    word = processor.tokenizer.convert_tokens_to_ids("cat")
    grid = (64, 28, 28)
    video_tokens = grid[0] * grid[1] * grid[2] // 4
    frames = 100
    while video_tokens + int(qwen3_audio_tokens(torch.tensor(frames + 100), thinker.audio_config.n_window)) < total - 64:
        frames += 100
    audio_tokens = int(qwen3_audio_tokens(torch.tensor(frames), thinker.audio_config.n_window))
    row = [word] * 16 + [ids["vision_bos"], ids["audio_bos"]] + [ids["video"]] * video_tokens
    row += [ids["audio"]] * audio_tokens + [ids["audio_eos"], ids["vision_eos"]]
    row += [word] * (total - len(row))
    kwargs = {"video_grid_thw": torch.tensor([grid]), "second_per_grids": torch.tensor([0.5]),
              "audio_seqlens": torch.tensor([frames]), "use_audio_in_video": True}
    return torch.tensor([row]), kwargs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    processor, config = build("Qwen3-Omni")
    fast = engine(processor, config, "qwen3_omni")
    reference = engine(processor, config, "qwen3_omni", implementation="reference")
    ids, kwargs = audio_in_video_sample(processor, config.thinker_config)
    got, want = fast.get_rope_index(ids, **kwargs), reference.get_rope_index(ids, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    t = timed({"reference": lambda: reference.get_rope_index(ids, **kwargs),
               "fast": lambda: fast.get_rope_index(ids, **kwargs)}, args.repeat)
    t_ref, t_fast = t["reference"], t["fast"]
    print(f"{environment()}\n")
    print(f"{'case':<52}{'reference':>12}{'fast':>12}{'ref/fast':>10}")
    print(f"{'Qwen3-Omni 1 x 32768, video (64,28,28) + its audio':<52}"
          f"{t_ref * 1e3:>10.1f}ms{t_fast * 1e3:>10.2f}ms{t_ref / t_fast:>9.0f}x")


if __name__ == "__main__":
    main()
