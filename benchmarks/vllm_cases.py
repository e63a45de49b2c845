"""The tests' cases of the Qwen-VL and Omni families' ``convention="vllm"``: short prompts and
multi-turn rollouts with every token's position in vLLM's rollout, computed by vLLM's own code
(vllm_anchor.py: ``get_mrope_input_positions`` for each request's prompt, the release's decode
for the tokens it generated). ``python benchmarks/vllm_side_by_side.py --source DIR --cases FILE
[--families ...]`` writes them, merged into FILE's cases of other releases, under
``"<family> vllm-X.Y"``: vLLM loads once per process, so run it once per release."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from trajectories import Trajectories
from vllm_anchor import Anchor, Sample, prompt_of

FAMILIES = ("Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "Qwen3.5", "GLM-4V", "GLM-4.6V", "Qwen2.5-Omni", "Qwen3-Omni")
# vLLM's model of these checkpoints is a subclass that keeps the other's position code
ANCHOR_FAMILY = {"Qwen3.5": "Qwen3-VL", "GLM-4.6V": "GLM-4V"}


def write_cases(anchor: Anchor, families: list[str], path: str) -> None:
    release = "vllm-" + ".".join(anchor.version.split(".")[:2])
    found = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
    found.update({f"{name} {release}": Cases(name, anchor).cases(release) for name in families})
    order = {name: index for index, name in enumerate(FAMILIES)}
    names = sorted(found, key=lambda key: (order.get(key.rsplit(" ", 1)[0], len(order)), key))
    with open(path, "w") as out:  # a case a line
        out.write("{\n" + ",\n".join(f"{json.dumps(name)}: [\n" + ",\n".join(
            json.dumps(case, separators=(",", ":")) for case in found[name]) + "\n]" for name in names) + "\n}\n")
    print(f"{', '.join(families)}: cases of {release} written to {path}")


class Cases(Trajectories):
    """One family's cases, computed by ``anchor``."""

    def __init__(self, name: str, anchor: Anchor) -> None:
        super().__init__(name)
        self.anchor, self.family = anchor, ANCHOR_FAMILY.get(name, name)

    def sample(self, row: list[int], media: dict[str, Any]) -> Sample:
        return Sample(row, media["image_grid_thw"], media["video_grid_thw"], media["seconds"] or None,
                      media["audio_seqlens"], bool(media.get("use_audio_in_video")))

    def cases(self, release: str, count: int = 4) -> list[dict[str, Any]]:
        """Short rollouts with vLLM's positions and delta, every other one its prompt alone, all
        but the last with videos; for the Omni families the second half videos with their audio."""
        rng = random.Random(f"vllm cases {self.name} {release}")
        out: list[dict[str, Any]] = []
        while len(out) < count:
            with_audio = self.omni and len(out) >= count // 2
            row, generated, media = self.rollout(rng, use_audio_in_video=with_audio)
            if len(row) > (320 if self.omni else 160) or ((len(out) < count - 1 or with_audio)
                                                           and not media["video_grid_thw"]):
                continue
            if len(out) % 2:
                length = generated.index(1)
                media = self.media_of(self.anchor_prompt(row, media, length))
                row, generated = row[:length], [0] * length
            want, delta = self.anchor.rollout(self.family, self.sample(row, media), generated, self.config,
                                              self.tokens)
            out.append({"tokens": self.symbols(row), "generated": "".join(map(str, generated)), **media,
                        "positions": want.tolist(), "delta": delta})
        return out

    def anchor_prompt(self, row: list[int], media: dict[str, Any], length: int) -> Sample:
        return prompt_of(self.family, self.sample(row, media), length, self.tokens)
