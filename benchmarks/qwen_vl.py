"""Qwen-VL positions: transformers reference vs mmrope's fast kernel, and the floor of merely
allocating the (3, B, L) output and filling it from one prepared row; the rollout engines'
conventions (``convention="vllm"``, ``"sglang"``) against the fast kernel's transformers one.
Prints ratios measured in this run (machines are noisy; compare ratios, not times).

    python benchmarks/qwen_vl.py [--repeat 10] [--memory]

``--memory`` also measures the peak memory of one 32 x 8192 call beyond its output, each call in
a fresh process (see ``timing.peak_memory``).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from samples import batch_with_media
from timing import engine, environment, in_fresh_processes, peak_memory, timed

from mmrope_core.kernel import RopeKernel
from mmrope_qwen_vl.examples import build


def as_trainers_call(reference, ids, mask, grids):
    """The transformers reference as trainers call it: the model class's ``get_rope_index`` on the
    batch with its own attention mask (after the reference kernel's input checks), whatever the
    engine would make of the mask."""
    kernel = reference.binding.kernel
    return lambda: kernel.rope_index(ids, attention_mask=mask, **grids)


class Prepared(RopeKernel):
    """A kernel that costs nothing: it returns results computed before."""

    def __init__(self, positions, deltas, position_ids):
        self.results = (positions, deltas), position_ids

    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
        return self.results[0]

    def position_ids(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
        return self.results[1]


def memory(call: str) -> None:
    """The peak memory of one call (``kernel``, ``engine`` or ``compute_position_ids``) on the 32 x
    8192 image batch beyond its output; run in a fresh process."""
    torch.set_num_threads(1)
    processor, config = build("Qwen2-VL")
    fast = engine(processor, config, "qwen_vl")
    ids, mask, grids = batch_with_media(processor, 32, 8192, [(1, 28, 28)] * 4, 512)
    small = batch_with_media(processor, 1, 2048, [(1, 28, 28)], 16)
    fast.compute_position_ids(small[0], small[1], small[2])  # every code path loaded
    fast.get_rope_index(small[0], small[1], **small[2])
    calls = {"kernel": lambda: fast.binding.kernel.rope_index(ids, mask.bool(), **grids),
             "engine": lambda: fast.get_rope_index(ids, mask, **grids),
             "compute_position_ids": lambda: fast.compute_position_ids(ids, mask, grids)}
    peak_memory(f"Qwen2-VL 32 x 8192 {call}", calls[call])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--measure-memory-of", choices=["kernel", "engine", "compute_position_ids"])
    args = parser.parse_args()
    if args.measure_memory_of:
        return memory(args.measure_memory_of)
    torch.set_num_threads(torch.get_num_threads())
    processor, config = build("Qwen2-VL")
    fast = engine(processor, config, "qwen_vl")
    reference = engine(processor, config, "qwen_vl", implementation="reference")
    rollouts = {name: engine(processor, config, "qwen_vl", convention=name) for name in ("vllm", "sglang")}
    print(f"{environment()}, best of {args.repeat} rounds of 5 calls; the vllm and sglang conventions' times "
          f"against fast's (transformers')\n")
    header = (f"{'case':<44}{'reference':>12}{'fast':>12}{'fill only':>12}{'ref/fast':>10}{'fast/fill':>11}"
              f"{'vllm/fast':>11}{'sglang/fast':>13}")
    print(header)
    print("-" * len(header))
    cases = [
        ("Qwen2-VL 32 x 8192, 4 images (1,28,28)/row", batch_with_media(processor, 32, 8192, [(1, 28, 28)] * 4, 512)),
        ("Qwen2-VL 8 x 32768, 1 video (16,36,36)/row", batch_with_media(processor, 8, 32768, [(16, 36, 36)])),
    ]
    for name, (ids, mask, grids) in cases:
        kwargs = dict(grids)
        assert all(torch.equal(a, b) for a, b in zip(fast.get_rope_index(ids, mask, **kwargs),
                                                      reference.get_rope_index(ids, mask, **kwargs)))
        row = torch.arange(ids.shape[1]).expand(ids.shape)
        t = timed({
            "reference": as_trainers_call(reference, ids, mask, kwargs),
            "fast": lambda: fast.get_rope_index(ids, mask, **kwargs),
            "fill": lambda: torch.empty(3, *ids.shape, dtype=ids.dtype).copy_(row.expand(3, *ids.shape)),
            **{convention: (lambda rollout=rollout: rollout.get_rope_index(ids, mask, **kwargs))
               for convention, rollout in rollouts.items()},
        }, args.repeat)
        t_ref, t_fast, t_fill = t["reference"], t["fast"], t["fill"]
        print(f"{name:<44}{t_ref * 1e3:>10.2f}ms{t_fast * 1e3:>10.2f}ms{t_fill * 1e3:>10.2f}ms"
              f"{t_ref / t_fast:>9.1f}x{t_fast / t_fill:>10.1f}x{t['vllm'] / t_fast:>10.2f}x{t['sglang'] / t_fast:>12.2f}x")

    single_sample(processor, config, fast, reference, args.repeat * 8)
    if args.memory:
        print()
        in_fresh_processes(__file__, ["kernel", "engine", "compute_position_ids"])


def single_sample(processor, config, fast, reference, repeat) -> None:
    """The per-call trainer case: what the engine adds to the plugin's own work (its kernel,
    called with the tensors the engine hands it: the mask as bool), measured around the kernel
    and with a kernel that costs nothing."""
    ids, mask, grids = batch_with_media(processor, 1, 4096, [(1, 28, 28)] * 2, 100)
    kernel, valid = fast.binding.kernel, mask.bool()
    kernels = {"get_rope_index": kernel.rope_index, "compute_position_ids": kernel.position_ids}
    bare = engine(processor, config, "qwen_vl")
    bare.binding = dataclasses.replace(bare.binding, kernel=Prepared(*kernel.rope_index(ids, valid, **grids),
                                                                     kernel.position_ids(ids, valid, **grids)))
    fns = {}
    for name, method in kernels.items():
        fns[f"plugin {name}"] = lambda method=method: method(ids, valid, **grids)
    fns["engine get_rope_index"] = lambda: fast.get_rope_index(ids, mask, **grids)
    fns["engine compute_position_ids"] = lambda: fast.compute_position_ids(ids, mask, grids)
    fns["bare get_rope_index"] = lambda: bare.get_rope_index(ids, mask, **grids)
    fns["bare compute_position_ids"] = lambda: bare.compute_position_ids(ids, mask, grids)
    fns["reference get_rope_index"] = as_trainers_call(reference, ids, mask, grids)
    fns["reference compute_position_ids"] = lambda: reference.compute_position_ids(ids, mask, grids)
    us = {name: seconds * 1e6 for name, seconds in timed(fns, repeat).items()}
    print(f"\nsingle sample 1 x 4096, 2 images, best of {repeat} x 5 (microseconds):")
    header = (f"{'':<24}{'plugin':>10}{'engine':>10}{'engine - plugin':>17}{'engine, plugin costing 0':>26}"
              f"{'reference':>11}{'ref/engine':>12}")
    print(header)
    print("-" * len(header))
    for name in kernels:
        plugin, whole, ref = us[f"plugin {name}"], us[f"engine {name}"], us[f"reference {name}"]
        print(f"{name:<24}{plugin:>10.1f}{whole:>10.1f}{whole - plugin:>17.1f}{us['bare ' + name]:>26.1f}"
              f"{ref:>11.1f}{ref / whole:>11.1f}x")


if __name__ == "__main__":
    main()
