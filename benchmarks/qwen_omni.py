"""Omni positions: the transformers thinker reference vs mmrope's kernel (Qwen3-Omni, float32).

Cases: one 1 x 4096 sample with a few media items (a video without, then with its audio
interleaved); a 32 x 8192 batch whose every row is one sample of ten or more items (images,
audio clips, videos with their audio interleaved); a 2 x 16500 batch of rows of about 140 short
videos with their audio each; 32 x 8192 rows each packed with several samples of 3 to 5 items
(``segment_ids``; the reference called once per sample); one 1 x 32768 sample holding a long video
with its audio. The reference is the thinker's own
``get_rope_index`` called as a trainer calls it (no input checks); ``engine`` is
``RopeEngine.get_rope_index``, ``kernel`` the binding's ``rope_index`` called directly (what the
engine adds is its input reading and the plugin hooks). One torch thread. Prints the ratios
measured in this run (machines are noisy: compare ratios, not times).

    python benchmarks/qwen_omni.py [--repeat 5] [--memory]

``--memory`` also measures the peak memory of one 32 x 8192 call beyond its output, each call in
a fresh process: the resident-set high-water mark is reset just before the call (Linux:
``/proc/self/clear_refs``), so the peak is the call's own, and glibc maps every allocation of
64 KiB or more afresh (``MALLOC_MMAP_THRESHOLD_``), so none hides in memory freed before.
tracemalloc would miss torch's allocations; it sees the extension's and numpy's (shown too).
Memory freed during the call offsets what it takes: the peak is good to a few hundred KiB.
"""

from __future__ import annotations

import argparse
import random

import torch
from timing import engine, environment, in_fresh_processes, peak_memory, timed

from mmrope_qwen3_omni.audio import qwen3_audio_tokens
from mmrope_qwen3_omni.binding import token_ids
from mmrope_qwen3_omni.examples import build

MERGE = 2


class Sample:
    """One sample's tokens and media, written item by item."""

    def __init__(self, processor, thinker) -> None:
        self.ids = token_ids(processor)
        self.word = processor.tokenizer.convert_tokens_to_ids("cat")
        self.n_window = thinker.audio_config.n_window
        self.row: list[int] = []
        self.images, self.videos, self.seconds, self.audio_frames = [], [], [], []
        self.audio_in_video = True  # until a video without its audio is added

    def text(self, count: int) -> Sample:
        self.row += [self.word] * count
        return self

    def audio_tokens(self, frames: int) -> int:
        return int(qwen3_audio_tokens(torch.tensor(frames), self.n_window))

    def image(self, grid) -> Sample:
        self.images.append(grid)
        self.row += [self.ids["vision_bos"]] + [self.ids["image"]] * (grid[0] * grid[1] * grid[2] // MERGE**2)
        self.row += [self.ids["vision_eos"]]
        return self

    def audio(self, frames: int) -> Sample:
        self.audio_frames.append(frames)
        self.row += [self.ids["audio_bos"]] + [self.ids["audio"]] * self.audio_tokens(frames) + [self.ids["audio_eos"]]
        return self

    def video(self, grid, seconds: float) -> Sample:
        self.videos.append(grid)
        self.seconds.append(seconds)
        self.row += [self.ids["vision_bos"]] + [self.ids["video"]] * (grid[0] * grid[1] * grid[2] // MERGE**2)
        self.row += [self.ids["vision_eos"]]
        self.audio_in_video = False
        return self

    def video_with_audio(self, grid, seconds: float) -> Sample:
        """A video and the audio of its duration (100 mel frames a second), interleaved."""
        frames = max(1, round(grid[0] * seconds * 100))
        self.videos.append(grid)
        self.seconds.append(seconds)
        self.audio_frames.append(frames)
        self.row += [self.ids["vision_bos"], self.ids["audio_bos"]]
        self.row += [self.ids["video"]] * (grid[0] * grid[1] * grid[2] // MERGE**2)
        self.row += [self.ids["audio"]] * self.audio_tokens(frames) + [self.ids["audio_eos"], self.ids["vision_eos"]]
        return self


def batch(samples: list[Sample], length: int):
    """The samples right-padded into one ``(B, length)`` batch, with their media in order."""
    ids = torch.full((len(samples), length), samples[0].word, dtype=torch.long)
    mask = torch.zeros(len(samples), length, dtype=torch.long)
    for index, sample in enumerate(samples):
        assert len(sample.row) <= length, len(sample.row)
        ids[index, : len(sample.row)] = torch.tensor(sample.row)
        mask[index, : len(sample.row)] = 1
    kwargs = {"use_audio_in_video": all(s.audio_in_video for s in samples)}
    if any(s.images for s in samples):
        kwargs["image_grid_thw"] = torch.tensor([g for s in samples for g in s.images])
    if any(s.videos for s in samples):
        kwargs["video_grid_thw"] = torch.tensor([g for s in samples for g in s.videos])
        kwargs["second_per_grids"] = torch.tensor([x for s in samples for x in s.seconds], dtype=torch.float32)
    if any(s.audio_frames for s in samples):
        kwargs["audio_seqlens"] = torch.tensor([f for s in samples for f in s.audio_frames])
    return ids, (None if bool(mask.all()) else mask), kwargs


def single_sample(processor, thinker):
    """1 x 4096: text, two images, an audio clip, a video (8, 28, 28) without audio, text."""
    sample = Sample(processor, thinker).text(40).image((1, 28, 28)).text(30).audio(1000).text(60)
    sample.video((8, 28, 28), 0.5).text(20).image((1, 28, 42))
    sample.text(4096 - len(sample.row))
    return batch([sample], 4096)


def single_sample_with_audio_in_video(processor, thinker):
    """1 x 4096: as :func:`single_sample`, the video's audio interleaved with it."""
    sample = Sample(processor, thinker).text(40).image((1, 28, 28)).text(30).audio(1000).text(60)
    sample.video_with_audio((8, 28, 28), 0.5).text(20).image((1, 28, 42))
    sample.text(4096 - len(sample.row))
    return batch([sample], 4096)


def random_items(sample, rng, counts, *, side, frames, frame_side, audio_frames, with_audio=True):
    """A few words, then ``counts[0]`` to ``counts[1]`` random items with text between them: images
    of up to ``side`` merged patches a side, audio clips of up to ``audio_frames`` mel frames,
    videos of up to ``frames`` frames with their audio (``with_audio``, else alone), at fractional
    seconds per grid."""
    sample.text(rng.randint(8, 40))
    for _ in range(rng.randint(*counts)):
        kind = rng.choice(["image", "image", "audio", "video"])
        if kind == "image":
            sample.image((1, 2 * rng.randint(6, side), 2 * rng.randint(6, side)))
        elif kind == "audio":
            sample.audio(rng.randint(100, audio_frames))
        else:
            video = sample.video_with_audio if with_audio else sample.video
            video((rng.randint(2, frames), 2 * rng.randint(6, frame_side), 2 * rng.randint(6, frame_side)),
                  rng.choice([0.5, 1.0, 2 / 3, 0.48]))
        sample.text(rng.randint(4, 60))
    return sample


def many_items(processor, thinker, rows=32, length=8192, seed=0, with_audio=True):
    """Each row one sample of 10 to 14 items (images, audio clips, videos with their audio or
    alone, with fractional timing), text between them, right-padded from 6500-8192 valid tokens."""
    rng = random.Random(seed)
    samples = []
    for _ in range(rows):
        sample = random_items(Sample(processor, thinker), rng, (10, 14), side=16, frames=6, frame_side=12,
                              audio_frames=1500, with_audio=with_audio)
        target = rng.randint(6500, length)
        if len(sample.row) < target:
            sample.text(target - len(sample.row))
        samples.append(sample)
    return batch(samples, length)


def packed_samples(processor, thinker, rows=32, length=8192, seed=2, with_audio=True):
    """Each row packed with several samples of 3 to 5 items each (``segment_ids``, padded at its
    end; videos with their audio, or alone); returns the packed batch and each sample alone, as
    the reference takes it."""
    rng = random.Random(seed)
    ids = torch.zeros(rows, length, dtype=torch.long)
    segments = torch.zeros(rows, length, dtype=torch.long)
    alone = []
    for r in range(rows):
        column, k = 0, 0
        while True:
            sample = random_items(Sample(processor, thinker), rng, (3, 5), side=12, frames=4, frame_side=10,
                                  audio_frames=1000, with_audio=with_audio)
            if column + len(sample.row) > length:
                break
            k += 1
            ids[r, column:column + len(sample.row)] = torch.tensor(sample.row)
            segments[r, column:column + len(sample.row)] = k
            column += len(sample.row)
            alone.append(batch([sample], len(sample.row)))
    kwargs: dict = {"use_audio_in_video": with_audio}
    for key in ("image_grid_thw", "video_grid_thw", "second_per_grids", "audio_seqlens"):
        parts = [one[2][key] for one in alone if key in one[2]]
        if parts:
            kwargs[key] = torch.cat(parts)
    return ids, segments, kwargs, alone


def many_videos(processor, thinker, rows=2, length=16500, seed=1):
    """Each row one sample of about 140 short videos, each with its audio interleaved, and a
    few words between them."""
    rng = random.Random(seed)
    samples = []
    for _ in range(rows):
        sample = Sample(processor, thinker).text(8)
        while len(sample.row) < length - 200:
            sample.video_with_audio((3, 2 * rng.randint(4, 6), 2 * rng.randint(4, 6)), rng.choice([0.5, 1.0, 2 / 3]))
            sample.text(rng.randint(4, 20))
        samples.append(sample)
    return batch(samples, length)


def audio_in_video(processor, thinker, total=32768):
    """Text, then one video (64 frames of 28 x 28 patches) with its audio, then text."""
    sample = Sample(processor, thinker).text(16)
    grid = (64, 28, 28)
    video_tokens = grid[0] * grid[1] * grid[2] // MERGE**2
    frames = 100
    while video_tokens + sample.audio_tokens(frames + 100) < total - 64:
        frames += 100
    sample.videos.append(grid)
    sample.seconds.append(0.5)
    sample.audio_frames.append(frames)
    ids = sample.ids
    sample.row += [ids["vision_bos"], ids["audio_bos"]] + [ids["video"]] * video_tokens
    sample.row += [ids["audio"]] * sample.audio_tokens(frames) + [ids["audio_eos"], ids["vision_eos"]]
    sample.text(total - len(sample.row))
    return batch([sample], total)


def memory(call: str) -> None:
    """The peak memory of one 32 x 8192 call (``kernel``, ``engine`` or ``position_ids``) beyond
    its output; run in a fresh process."""
    torch.set_num_threads(1)
    processor, config = build("Qwen3-Omni")
    fast = engine(processor, config, "qwen3_omni")
    kernel = fast.binding.kernel
    ids, mask, kwargs = many_items(processor, config.thinker_config)
    bool_mask = mask.bool()
    small, small_mask, small_kwargs = many_items(processor, config.thinker_config, rows=1)
    kernel.rope_index(small, small_mask.bool(), **small_kwargs)  # every code path loaded
    calls = {"kernel": lambda: kernel.rope_index(ids, bool_mask, **kwargs),
             "engine": lambda: fast.get_rope_index(ids, mask, **kwargs),
             "position_ids": lambda: kernel.position_ids(ids, bool_mask, **kwargs)}
    peak_memory(f"Omni 32 x 8192 {call}", calls[call])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--measure-memory-of", choices=["kernel", "engine", "position_ids"])
    args = parser.parse_args()
    if args.measure_memory_of:
        return memory(args.measure_memory_of)
    torch.set_num_threads(1)
    processor, config = build("Qwen3-Omni")
    thinker = config.thinker_config
    fast = engine(processor, config, "qwen3_omni")
    reference = engine(processor, config, "qwen3_omni", implementation="reference")
    own = reference.binding.kernel.model.get_rope_index  # the thinker's method, bound to the config
    kernel = fast.binding.kernel.rope_index
    print(f"{environment()}, best of {args.repeat} rounds of 5 calls\n")
    rollouts(processor, config, args.repeat)
    header = (f"{'case':<46}{'reference':>11}{'engine':>10}{'kernel':>10}{'ref/engine':>12}{'ref/kernel':>12}")
    print(header)
    print("-" * len(header))
    cases = [
        ("1 x 4096, 2 images, audio, video", single_sample(processor, thinker), 8),
        ("1 x 4096, 2 images, audio, video + its audio", single_sample_with_audio_in_video(processor, thinker), 4),
        ("32 x 8192, 10-14 items a row", many_items(processor, thinker), 1),
        ("2 x 16500, ~140 videos + their audio a row", many_videos(processor, thinker), 1),
        ("1 x 32768, video (64,28,28) + its audio", audio_in_video(processor, thinker), 1),
    ]
    packed_ids, segments, packed_kwargs, alone = packed_samples(processor, thinker)
    for name, (ids, mask, kwargs), rounds in cases:
        ones = torch.ones_like(ids) if mask is None else mask
        want = own(input_ids=ids, attention_mask=ones, **kwargs)
        for got in (fast.get_rope_index(ids, mask, **kwargs), kernel(ids, None if mask is None else mask.bool(), **kwargs)):
            assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want)), name
        bool_mask = None if mask is None else mask.bool()
        t = timed({
            "reference": lambda: own(input_ids=ids, attention_mask=ones, **kwargs),
            "engine": lambda: fast.get_rope_index(ids, mask, **kwargs),
            "kernel": lambda: kernel(ids, bool_mask, **kwargs),
        }, args.repeat * rounds)
        print(f"{name:<46}{t['reference'] * 1e3:>9.2f}ms{t['engine'] * 1e3:>8.3f}ms{t['kernel'] * 1e3:>8.3f}ms"
              f"{t['reference'] / t['engine']:>11.0f}x{t['reference'] / t['kernel']:>11.0f}x")
    # rows packed with several samples: the reference called per sample, the engine once
    positions, _ = fast.get_rope_index(packed_ids, segment_ids=segments, **packed_kwargs)
    valid = positions.permute(1, 2, 0).reshape(-1, 3)[segments.reshape(-1) > 0]  # (tokens, 3)
    start = 0
    for ids, mask, kwargs in alone:
        want, _ = own(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        assert torch.equal(valid[start:start + ids.shape[1]].t(), want[:, 0]), "packed"
        start += ids.shape[1]
    t = timed({
        "reference": lambda: [own(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
                              for ids, _, kwargs in alone],
        "engine": lambda: fast.get_rope_index(packed_ids, segment_ids=segments, **packed_kwargs),
    }, args.repeat)
    name = f"32 x 8192 packed, {len(alone)} samples (segment_ids)"
    print(f"{name:<46}{t['reference'] * 1e3:>9.2f}ms{t['engine'] * 1e3:>8.3f}ms{'-':>10}"
          f"{t['reference'] / t['engine']:>11.0f}x{'-':>12}")
    if args.memory:
        print()
        in_fresh_processes(__file__, ["kernel", "engine", "position_ids"])


def left_padded(ids, mask):
    """The rows of a right-padded batch with their padding moved to the left."""
    ids, mask = ids.clone(), mask.clone()
    for row in range(ids.shape[0]):
        shift = int((mask[row] == 0).sum())
        ids[row], mask[row] = ids[row].roll(shift), mask[row].roll(shift)
    return ids, mask


def rollouts(processor, config, repeat) -> None:
    """The rollout engines' conventions against the transformers one, on the engine, with videos
    alone (SGLang computes no video with its audio): vLLM's integer positions, SGLang's truncated
    ones, and SGLang's with half the tokens of every row in generated runs of 64 (where its
    decoded tokens sit elsewhere than a prefill puts them); padded on either side and packed."""
    thinker = config.thinker_config
    engines = {convention: engine(processor, config, "qwen3_omni", convention=convention)
               for convention in ("transformers", "vllm", "sglang")}
    header = f"{'case (engine.get_rope_index)':<46}{'tf':>10}{'vllm/tf':>10}{'sglang/tf':>11}{'generated/tf':>14}"
    print(header)
    print("-" * len(header))
    ids, mask, kwargs = many_items(processor, thinker, with_audio=False)
    packed_ids, segments, packed_kwargs, _ = packed_samples(processor, thinker, with_audio=False)
    cases = [("1 x 4096, 2 images, audio, video", (*single_sample(processor, thinker), {})),
             ("32 x 8192, 10-14 items a row, videos alone", (ids, mask, kwargs, {})),
             ("32 x 8192, the same padded on the left", (*left_padded(ids, mask), kwargs, {})),
             ("32 x 8192 packed, videos alone (segment_ids)", (packed_ids, None, packed_kwargs,
                                                               {"segment_ids": segments}))]
    word = processor.tokenizer.convert_tokens_to_ids("cat")
    for name, (ids, mask, kwargs, packed) in cases:
        valid = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        if packed:
            valid = packed["segment_ids"] > 0
        generated = (torch.arange(ids.shape[1]) // 64 % 2 == 1) & (ids == word) & valid  # text, in runs
        starts = valid & ~torch.nn.functional.pad(valid, (1, 0))[:, :-1]
        if packed:  # (each segment's first token)
            starts |= valid & (packed["segment_ids"] != packed["segment_ids"].roll(1, dims=1))
        generated &= ~starts
        inputs = {**kwargs, **packed}
        t = timed({
            "tf": lambda: engines["transformers"].get_rope_index(ids, mask, **inputs),
            "vllm": lambda: engines["vllm"].get_rope_index(ids, mask, **inputs),
            "sglang": lambda: engines["sglang"].get_rope_index(ids, mask, **inputs),
            "generated": lambda: engines["sglang"].get_rope_index(ids, mask, generated_mask=generated, **inputs),
        }, repeat * (8 if ids.shape[0] == 1 else 1))
        print(f"{name:<46}{t['tf'] * 1e3:>8.3f}ms{t['vllm'] / t['tf']:>9.2f}x{t['sglang'] / t['tf']:>10.2f}x"
              f"{t['generated'] / t['tf']:>13.2f}x")
    print()


if __name__ == "__main__":
    main()
