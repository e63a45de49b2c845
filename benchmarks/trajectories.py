"""Generated prompts and multi-turn trajectories of one family, as the rollout-engine side-by-side
scripts feed them to SGLang's and vLLM's code: token ids and their media items as lists (in order
of appearance), keyword arguments for mmrope, and the symbols the tests' cases write tokens as."""

from __future__ import annotations

import copy
import random
from typing import Any

import torch

from samples import Omni, built_family, vl_random_sample

OMNI_FAMILIES = ("Qwen2.5-Omni", "Qwen3-Omni")


class Trajectories:
    """One family's processor, config and token ids, and generators of its samples."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.omni = name in OMNI_FAMILIES
        processor, config, self.tokens = built_family(name)
        if self.omni:
            self.built = Omni(name)
            self.words, self.pad = self.built.words, self.built.pad
            merge = int(config.thinker_config.vision_config.spatial_merge_size)
        else:
            self.words = processor.tokenizer.convert_tokens_to_ids(["the", "cat", "sat", "on"])
            self.pad = processor.tokenizer.pad_token_id
            merge = int(config.vision_config.spatial_merge_size)
            if self.tokens.video_start is not None:  # GLM's code reads the ids from the config
                config = copy.copy(config)
                config.image_token_id, config.video_start_token_id = self.tokens.image, self.tokens.video_start
                config.video_end_token_id = self.tokens.video_end
        self.processor, self.config, self.merge = processor, config, merge

    def prompt(self, rng: random.Random, long: bool = False,
               use_audio_in_video: bool = False) -> tuple[list[int], dict[str, Any]]:
        """One generated prompt's tokens and media (lists, in order of appearance); ``long``: for
        the Omni families, one of 300 to 1500 tokens whose videos have more tokens per frame than
        positions (deltas below 0, where SGLang's decode and prefill part); ``use_audio_in_video``:
        Omni videos with their audio (media then say so)."""
        if self.omni and long:
            drawn = self.built.row(rng, rng.randint(300, 1500), use_audio_in_video)
            media = {"image_grid_thw": drawn["image_grid_thw"], "video_grid_thw": drawn["video_grid_thw"],
                     "seconds": drawn["second_per_grids"], "audio_seqlens": drawn["audio_seqlens"]}
            media = {key: [list(item) if isinstance(item, tuple) else item for item in value]
                     for key, value in media.items()}
            return drawn["row"], media | ({"use_audio_in_video": True} if use_audio_in_video else {})
        if self.omni:
            batch, _ = self.built.random_sample(rng, use_audio_in_video=use_audio_in_video)
            seconds_key = "second_per_grids"
        else:
            batch = vl_random_sample(self.processor, rng)
            seconds_key = "second_per_grid_ts"
        ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
        media = {"image_grid_thw": [], "video_grid_thw": [], "seconds": [], "audio_seqlens": []}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor):
                media["seconds" if key == seconds_key else key] = value.tolist()
        if use_audio_in_video:
            media["use_audio_in_video"] = True
        return ids[0][mask[0].bool()].tolist(), media

    def image(self, grid: tuple[int, int, int]) -> list[int]:
        t = self.tokens
        return [t.vision_start] + [t.image] * (grid[0] * grid[1] * grid[2] // self.merge**2) + [t.vision_end]

    def rollout(self, rng: random.Random, use_audio_in_video: bool = False) -> tuple[list[int], list[int], dict]:
        """A trajectory: a prompt (half of them long, see :meth:`prompt`), then 1 to 3 runs of
        generated tokens, tool output (text, one in three with an image) between runs and, one
        time in three, after the last."""
        row, media = self.prompt(rng, long=rng.random() < 0.5, use_audio_in_video=use_audio_in_video)
        generated = [0] * len(row)
        turns = rng.randint(1, 3)
        for turn in range(turns):
            run = [rng.choice(self.words) for _ in range(rng.randint(1, 20))]
            row, generated = row + run, generated + [1] * len(run)
            if turn + 1 < turns or rng.random() < 1 / 3:
                tool = [rng.choice(self.words) for _ in range(rng.randint(1, 8))]
                if rng.random() < 1 / 3:
                    grid = (1, self.merge * rng.randint(1, 4), self.merge * rng.randint(1, 4))
                    media["image_grid_thw"].append(list(grid))
                    tool += self.image(grid) + [rng.choice(self.words)]
                row, generated = row + tool, generated + [0] * len(tool)
        return row, generated, media

    def kwargs(self, media: dict[str, Any]) -> dict[str, Any]:
        """mmrope's ``get_rope_index`` keyword arguments for these media."""
        kwargs: dict[str, Any] = {}
        for key in ("image_grid_thw", "video_grid_thw"):
            if media[key]:
                kwargs[key] = torch.tensor(media[key])
        if media["video_grid_thw"] and (self.omni or self.name == "Qwen2.5-VL"):
            kwargs["second_per_grids" if self.omni else "second_per_grid_ts"] = torch.tensor(media["seconds"],
                                                                                           dtype=torch.float32)
        if media["audio_seqlens"]:
            kwargs["audio_seqlens"] = torch.tensor(media["audio_seqlens"])
        if media.get("use_audio_in_video"):
            kwargs["use_audio_in_video"] = True
        return kwargs

    @staticmethod
    def media_of(sample: Any) -> dict[str, Any]:
        """The media of an anchor's ``Sample`` (SGLang's or vLLM's) as :meth:`prompt` gives them."""
        media = {"image_grid_thw": list(sample.image_grid_thw), "video_grid_thw": list(sample.video_grid_thw),
                 "seconds": list(sample.second_per_grid_ts or []), "audio_seqlens": list(sample.audio_feature_lengths)}
        return media | ({"use_audio_in_video": True} if getattr(sample, "use_audio_in_video", False) else {})

    def symbols(self, row: list[int]) -> str:
        """t (text), [ ] (vision start, end: GLM's begin and end of image), i v a (image, video,
        audio token), ( ) (audio start, end), { } (GLM's begin and end of video)."""
        t = self.tokens
        table = {t.vision_start: "[", t.vision_end: "]", t.image: "i", t.video: "v", t.video_start: "{",
                 t.video_end: "}", t.audio: "a", t.audio_start: "(", t.audio_end: ")"}
        return "".join(table.get(token, "t") for token in row)
