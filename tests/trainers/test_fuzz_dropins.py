"""The drop-ins' entry points fuzzed with the frameworks' own code running: LLaMA-Factory's SFT
collator (padded and ``neat_packing``) and ms-swift's data collator (padded and padding-free)
after ``install()``, and verl's ``_compute_position_ids`` on the drop-in processor. Their data goes
wrong the way a dataset's does: samples truncated inside an image, placeholders sampled in a
response, media lost, changed or doubled, corrupt packing, keys that are not names. Each call
gives the positions the model computes itself (transformers' own ``get_rope_index``, called
directly), or raises: a typed mmrope error, or the framework's own error from its own code.
Nothing untyped comes out of mmrope."""

from __future__ import annotations

import copy
import functools
import random
import traceback
from pathlib import Path

import llamafactory_cases as lf
import pytest
import swift_cases as sw
import torch
from cases import FAMILIES as VERL_FAMILIES
from cases import build as verl_build
from cases import trajectories

from mmrope_core.errors import MmropeError, PluginError
from mmrope_core.testing._direct import ModelPositions

lf.import_llamafactory()  # before the modules below import LLaMA-Factory (its torchaudio stand-in)

from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402

from mmrope_core.integrations import llamafactory as lf_drop_in  # noqa: E402
from mmrope_core.integrations import swift as swift_drop_in  # noqa: E402
from mmrope_core.integrations.verl import as_verl_processor  # noqa: E402

FRAMEWORKS = ("llamafactory", "swift", "verl")
#: batches per framework, each drawn from its own seed: a few seconds each on two cores
DRAWS = {"llamafactory": 80, "swift": 150, "verl": 300}


def fuzzed(framework: str, one) -> None:
    """``one(rng)`` for each draw; every problem it returns is reported at the end."""
    problems = [problem for draw in range(DRAWS[framework])
                if (problem := one(random.Random(f"{framework} {draw}")))]
    assert problems == [], "\n".join(problems)


def untyped(error: BaseException) -> str:
    """What is wrong with an error: nothing for a typed mmrope input error, or for one that the
    framework's own code raised (the deepest frame of mmrope or a framework is the framework's)."""
    if isinstance(error, MmropeError) and not isinstance(error, PluginError):
        return ""
    owners = [owner for owner in map(_owner, traceback.extract_tb(error.__traceback__)) if owner]
    if owners and owners[-1] == "framework":
        return ""
    return f"{type(error).__name__}: {error}"


def _owner(frame: traceback.FrameSummary) -> str | None:
    parts = Path(frame.filename).parts
    if any(part.startswith("mmrope_") for part in parts):
        return "mmrope"
    return "framework" if any(part in FRAMEWORKS for part in parts) else None


def outcome(call):
    try:
        return call()
    except Exception as error:  # judged by the caller
        return error


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and got.dtype == want.dtype and bool(torch.equal(got, want))


def token_from_elsewhere(ids: list[int], rng: random.Random) -> list[int]:
    """One token replaced by another of the sample's own: a placeholder or marker sampled in a response."""
    changed = list(ids)
    changed[rng.randrange(len(changed))] = rng.choice(ids)
    return changed


# -- LLaMA-Factory ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lf_installed():
    with lf.drop_in_installed():
        yield


@functools.cache
def lf_model(name: str) -> ModelPositions:
    processor, config, _ = lf.family(name)
    found = ModelPositions.of(processor, config, "mrope")
    assert found is not None, name
    return found


def lf_mutated(features: list[dict], rng: random.Random, packed: bool) -> list[str]:
    """Change LLaMA-Factory features in place as its data can go wrong; the names of the changes."""
    names = []
    for _ in range(rng.randint(0, 2)):
        feature = rng.choice([feature for feature in features if isinstance(feature, dict)])
        kind = rng.choice(["truncated", "sampled", "media dropped", "image doubled", "reversed", "not a dict", "key",
                           "no images", "renumbered" if packed else "padding inside"])
        length = len(feature["input_ids"])
        if kind == "truncated" and length > 1:
            keep = rng.randint(1, length - 1)
            for key in ("input_ids", "attention_mask", "labels"):
                feature[key] = feature[key][:keep]
        elif kind == "sampled":
            feature["input_ids"] = token_from_elsewhere(feature["input_ids"], rng)
        elif kind == "media dropped" and any(feature[key] for key in ("images", "videos", "audios")):
            key = rng.choice([key for key in ("images", "videos", "audios") if feature[key]])
            feature[key] = feature[key][:-1]
        elif kind == "image doubled" and feature["images"]:
            feature["images"] = feature["images"] + feature["images"][-1:]
        elif kind == "reversed":
            features.reverse()
        elif kind == "padding inside" and length > 1:
            feature["attention_mask"] = [0 if index == rng.randrange(length) else 1 for index in range(length)]
        elif kind == "not a dict":
            features[features.index(feature)] = rng.choice(["a text", [1, 2, 3]])
        elif kind == "key":
            feature[rng.choice([0, ("images",)])] = [1]
        elif kind == "no images":  # a datasets row holds None where its sample has none
            feature["images"] = None
        elif kind == "renumbered":  # a neat-packing mask whose segments are not numbered 1, 2, ...
            feature["attention_mask"] = [value + 1 if value > 1 else value for value in feature["attention_mask"]]
        else:
            continue
        names.append(kind)
    return names


def test_llamafactory_collator(lf_installed):
    fuzzed("llamafactory", llamafactory_draw)


def llamafactory_draw(rng: random.Random) -> str:
    name = rng.choice(lf.FAMILIES)
    packed = rng.random() < 0.4 and name not in lf.OMNI  # LLaMA-Factory itself refuses Omni packing
    groups = [lf.features(name, rng, rng.randint(1, 3)) for _ in range(2 if packed else 1)]
    if packed:
        cutoff = max(sum(len(sample["input_ids"]) for sample in group) for group in groups) + rng.randint(0, 9)
        cutoff += -(cutoff + 1) % 8  # LLaMA-Factory packs to cutoff_len + 1, a multiple of 8
        features = lf.packed(groups, cutoff)
        collator = lf.collator(name, neat_packing=True, block_diag_attn=True)
    else:
        features = groups[0]
        collator = lf.collator(name)
    names = lf_mutated(features, rng, packed)
    where = f"{name}{' packed' if packed else ''} {names}"
    got = outcome(lambda: collator(copy.deepcopy(features)))
    if isinstance(got, BaseException):
        return untyped(got) and f"{where}: {untyped(got)}"
    if packed and names and names != ["reversed"]:
        return ""  # the samples the positions belong to are no longer known
    if packed and names:
        groups = groups[::-1]
    samples = [sample for group in groups for sample in group]
    media = lf.media_of(got, samples)
    if not packed:
        want = outcome(lambda: lf_model(name).position_ids(got["input_ids"], got["attention_mask"], media, None))
        # where the model's own code fails there are no positions to compare with
        wrong = not isinstance(want, BaseException) and not same(got["position_ids"].transpose(0, 1), want)
        return f"{where}: the positions differ from the model's own" if wrong else ""
    index = 0
    for row, group in enumerate(groups):
        start = 0
        for sample in group:
            ids = torch.tensor([sample["input_ids"]])
            want = lf_model(name).position_ids(ids, None, lf.segment_media(media, samples, index), None)
            if not same(got["position_ids"][:, row, start:start + ids.shape[1]], want[0]):
                return f"{where}: sample {index} differs from the model's own positions for it alone"
            start, index = start + ids.shape[1], index + 1
    return ""


# -- ms-swift -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swift_installed():
    swift_drop_in.install()
    yield
    for module_name, names in swift_drop_in.TEMPLATE_CLASSES.items():
        module = __import__(module_name, fromlist=list(names))
        for cls in (getattr(module, name) for name in names):
            method = cls.__dict__["_get_position_ids"]
            cls._get_position_ids = getattr(method, "__mmrope_original__", method)


@functools.cache
def swift_template(name: str, padding_free: bool):
    return sw.template(name, padding_free=padding_free)


@functools.cache
def swift_model(name: str) -> ModelPositions:
    processor, config = sw.family(name)
    found = ModelPositions.of(processor, config, "mrope")
    assert found is not None, name
    return found


def timed(inputs: dict) -> dict:
    """ms-swift's video timings, kept as lists, as the processor gives them: float32 tensors."""
    return {key: torch.tensor(value, dtype=torch.float32) if key in ("second_per_grid_ts", "video_second_per_grid")
            and isinstance(value, list) else value for key, value in inputs.items()}


def swift_mutated(rows: list[dict], rng: random.Random) -> list[str]:
    """Change encoded ms-swift rows in place as its data can go wrong; the names of the changes."""
    names = []
    for _ in range(rng.randint(0, 2)):
        row = rng.choice(rows)
        kind = rng.choice(["truncated", "sampled", "grid changed", "grid dropped", "seconds", "key", "reversed"])
        length = len(row["input_ids"])
        if kind == "truncated" and length > 1:
            keep = rng.randint(1, length - 1)
            row.update(input_ids=row["input_ids"][:keep], labels=row["labels"][:keep], length=keep)
        elif kind == "sampled":
            row["input_ids"] = token_from_elsewhere(row["input_ids"], rng)
        elif kind == "grid changed" and row.get("image_grid_thw") is not None:
            grid = row["image_grid_thw"].clone()
            grid[rng.randrange(len(grid)), rng.randint(0, 2)] = rng.choice([0, 1, 4, 2**31])
            row["image_grid_thw"] = grid
        elif kind == "grid dropped" and row.get("image_grid_thw") is not None:
            del row["image_grid_thw"]
        elif kind == "seconds" and row.get("second_per_grid_ts"):
            row["second_per_grid_ts"] = [rng.choice([float("nan"), -1.0, 1e30])] * len(row["second_per_grid_ts"])
        elif kind == "key":
            row[rng.choice([0, ("image_grid_thw",)])] = torch.ones(1, 3, dtype=torch.long)
        elif kind == "reversed":
            rows.reverse()
        else:
            continue
        names.append(kind)
    return names


def test_swift_data_collator(swift_installed):
    fuzzed("swift", swift_draw)


def swift_draw(rng: random.Random) -> str:
    name = rng.choice(list(sw.FAMILIES))
    padding_free = rng.random() < 0.5
    template = swift_template(name, padding_free)
    template.use_audio_in_video = False
    rows = [row for row, _ in sw.rows(name, template, rng, rng.randint(1, 3))]
    names = swift_mutated(rows, rng)
    where = f"{name}{' padding-free' if padding_free else ''} {names}"
    got = outcome(lambda: template.data_collator(copy.deepcopy(rows)))
    if isinstance(got, BaseException):
        return untyped(got) and f"{where}: {untyped(got)}"
    model = swift_model(name)
    if not padding_free:
        want = outcome(lambda: model.rope_index(got["input_ids"], got["attention_mask"],
                                                model.forward_arguments(timed(got), None)))
        wrong = not isinstance(want, BaseException) and not same(got["position_ids"], want[0])
        return f"{where}: the positions differ from the model's own" if wrong else ""
    start = 0
    for index, row in enumerate(rows):
        ids = torch.tensor([row["input_ids"]])
        media = timed({key: value for key, value in row.items() if isinstance(key, str)})
        want = outcome(functools.partial(model.rope_index, ids, None, model.forward_arguments(media, None)))
        if not isinstance(want, BaseException) and not same(got["position_ids"][:, :, start:start + ids.shape[1]],
                                                            want[0]):
            return f"{where}: row {index} differs from the model's own positions for it alone"
        start += ids.shape[1]
    return ""


# -- verl ---------------------------------------------------------------------------------------


@functools.cache
def verl_subjects(name: str):
    processor, config = verl_build(name)
    drop_in = as_verl_processor(processor, config)
    return type("Worker", (), {"processor": drop_in})(), ModelPositions.of(processor, config,
                                                                           drop_in.rope_engine.rope_kind)


def verl_mutated(ids: torch.Tensor, mask: torch.Tensor, inputs: dict, rng: random.Random):
    names = []
    for _ in range(rng.randint(0, 2)):
        kind = rng.choice(["sampled", "truncated", "grid changed", "grid as a list", "grid dropped", "key",
                           "mask value", "ids int32", "seconds"])
        if kind == "sampled":
            ids = torch.tensor([token_from_elsewhere(ids[0].tolist(), rng)])
        elif kind == "truncated":
            keep = rng.randint(1, ids.shape[1])
            ids, mask = ids[:, :keep], mask[:, :keep]
        elif kind == "grid changed" and isinstance(inputs.get("image_grid_thw"), torch.Tensor):
            grid = inputs["image_grid_thw"].clone()
            grid[rng.randrange(len(grid)), rng.randint(0, 2)] = rng.choice([0, -2, 4, 2**40])
            inputs["image_grid_thw"] = grid
        elif kind == "grid as a list" and isinstance(inputs.get("image_grid_thw"), torch.Tensor):
            inputs["image_grid_thw"] = inputs["image_grid_thw"].tolist()
        elif kind == "grid dropped" and inputs.get("image_grid_thw") is not None:
            del inputs["image_grid_thw"]
        elif kind == "key":
            inputs[rng.choice([0, b"video_grid_thw"])] = torch.ones(1, 3, dtype=torch.long)
        elif kind == "mask value":
            mask = mask.clone()
            mask[0, rng.randrange(mask.shape[1])] = 2
        elif kind == "ids int32":
            ids = ids.int()
        elif kind == "seconds" and inputs.get("second_per_grid_ts") is not None:
            inputs["second_per_grid_ts"] = torch.full_like(torch.as_tensor(inputs["second_per_grid_ts"]), float("nan"))
        else:
            continue
        names.append(kind)
    return ids, mask, names


def test_verl_compute_position_ids():
    fuzzed("verl", verl_draw)


def verl_draw(rng: random.Random) -> str:
    name = rng.choice(VERL_FAMILIES)
    worker, model = verl_subjects(name)
    trajectory = trajectories(name, rng, 1)[0]
    ids, mask = trajectory.verl_layout(rng, worker.processor.tokenizer.pad_token_id)
    inputs = trajectory.inputs()
    ids, mask, names = verl_mutated(ids, mask, inputs, rng)
    where = f"{name} {names}"
    got = outcome(lambda: AgentLoopWorker._compute_position_ids(worker, ids, mask, dict(inputs)))
    if isinstance(got, BaseException):
        return untyped(got) and f"{where}: {untyped(got)}"
    if model.method is None and bool((mask > 1).any()):
        return ""  # 1-D: verl counts the mask's values itself, mmrope takes no part
    want = outcome(lambda: model.position_ids(ids, mask, inputs, None))
    wrong = not isinstance(want, BaseException) and not (got.shape == want.shape and torch.equal(got.long(), want.long()))
    return f"{where}: the positions differ from the model's own" if wrong else ""


# -- the harness finds what it looks for --------------------------------------------------------


def test_an_untyped_error_of_mmrope_is_told_from_the_frameworks_own():
    from mmrope_core.errors import PlaceholderMismatchError

    mmrope_fault = outcome(lambda: lf_drop_in._injected_media(None, []))
    framework_fault = outcome(lambda: lf.collator("Qwen2-VL")(["a text"]))  # LLaMA-Factory's own, not installed
    assert untyped(mmrope_fault) and not untyped(framework_fault)
    assert not untyped(PlaceholderMismatchError("sample 0, image 0: found 3"))


def test_positions_other_than_the_models_are_found(monkeypatch):
    from mmrope_core.integrations.verl import RopeIndex

    original = RopeIndex.__call__
    monkeypatch.setattr(RopeIndex, "__call__", lambda self, *args, **kwargs: tuple(
        value + 1 for value in original(self, *args, **kwargs)))
    problems = [verl_draw(random.Random(f"verl {draw}")) for draw in range(20)]
    assert any("differ from the model's own" in problem for problem in problems), problems
