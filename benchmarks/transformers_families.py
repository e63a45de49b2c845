"""Every model type mmrope-transformers binds: the engine's positions against the model's own
``get_rope_index``, measured in this run on batches laid out as each processor lays them out.
Prints ratios (machines are noisy: compare ratios, not times).

    python benchmarks/transformers_families.py [--repeat 5] [--rows 16]
"""

from __future__ import annotations

import argparse
import inspect
import random
import types
import warnings

import torch
import transformers
from timing import engine, environment, timed

from mmrope_transformers import examples
from mmrope_transformers.layouts import LAYOUTS, processor_batch, random_batch

HELPERS = ("get_vision_position_ids", "_group_visual_frames", "_frame_end_idx", "get_rope_index")


def own_method(engine_, processor, config):
    """The model class's own method on a config-only object, with the processor's token types
    computed beforehand: what the model's forward spends on positions."""
    model_class = engine_.binding.kernel.model_class if hasattr(engine_.binding.kernel, "model_class") else None
    model = types.SimpleNamespace(config=config)
    for name in HELPERS:
        try:
            found = inspect.getattr_static(model_class, name)
        except AttributeError:
            continue
        setattr(model, name, found.__func__ if isinstance(found, staticmethod)
                else types.MethodType(getattr(model_class, name), model))
    parameters = inspect.signature(model_class.get_rope_index).parameters

    def prepare(ids, mask, inputs):
        arguments = {key: value for key, value in inputs.items() if key in parameters}
        if "mm_token_type_ids" in parameters:
            arguments["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(ids.tolist()))
        return lambda: model.get_rope_index(input_ids=ids, attention_mask=mask, **arguments)

    return prepare


def batch_of(model_type, processor, config, engine_, rng, rows):
    if model_type in LAYOUTS:
        batch = random_batch(model_type, processor, config, rng, samples=rows, max_items=8, side=12)
        ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
        return ids, mask, batch
    return engine_.batch(processor_batch(model_type, processor, rng, max_batch=rows, max_images=6))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rows", type=int, default=16)
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    print(f"{environment()}, best of {args.repeat} rounds of 5 calls\n")
    header = f"{'model type':<18}{'implementation':<16}{'batch':>12}{'model':>11}{'mmrope':>11}{'model/mmrope':>14}"
    print(header)
    print("-" * len(header))
    rng = random.Random(0)
    for spec in examples.MROPE_SPECS:
        if examples.available(spec):
            measure(spec, rng, args.rows, args.repeat)


def measure(spec, rng, rows, repeat) -> None:
    processor, config = examples.build(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fast = engine(processor, config, "transformers")
        reference = engine(processor, config, "transformers", implementation="reference")
    ids, mask, inputs = batch_of(spec.model_type, processor, config, fast, rng, rows)
    kwargs = fast.rope_index_kwargs(inputs)
    own = own_method(reference, processor, config)(ids, mask, inputs)
    want = own()
    got = fast.get_rope_index(ids, mask, **kwargs)
    assert all(torch.equal(a, b.reshape(a.shape)) for a, b in zip(got, want)), spec.model_type
    t = timed({"model": own, "mmrope": lambda: fast.get_rope_index(ids, mask, **kwargs)}, repeat)
    print(f"{spec.model_type:<18}{fast.implementation:<16}{'x'.join(map(str, ids.shape)):>12}"
          f"{t['model'] * 1e3:>9.2f}ms{t['mmrope'] * 1e3:>9.2f}ms{t['model'] / t['mmrope']:>13.1f}x")


if __name__ == "__main__":
    main()
