"""Every Python snippet of the README and docs/ runs, on tiny real processors and models built
offline. A snippet marked ``<!-- snippet: NAME -->`` runs after the set-up NAME below has put its
free names in place (a hub id in a local Hugging Face cache, a tiny model, samples); the
snippets of one page share their names, in order. ``<!-- snippet: compile -->`` marks one that
needs a real checkpoint or a GPU: it is compiled. The snippets of docs/trainers.md are taken
from the examples, which run in the trainers' tests (tests/trainers/test_docs.py)."""

from __future__ import annotations

import itertools
import random
import re
import sys
from pathlib import Path

import pytest
import torch

from mmrope_core import RopeEngine
from mmrope_core.tiny import processors_without_torchvision

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TAKEN_FROM_EXAMPLES = ROOT / "docs" / "trainers.md"
SNIPPET = re.compile(r"(?:<!-- snippet: ([\w ]+) -->\n)?```python\n(.*?)```", re.S)
HUB_ID = "Qwen/Qwen2.5-VL-7B-Instruct"  # what the snippets load, as model cards show it


def snippets(page: Path) -> list[tuple[str, str]]:
    """``(set-up, code)`` of each Python block of ``page``, in order."""
    return [(setup or "", code) for setup, code in SNIPPET.findall(page.read_text())]


def padding_free_cases():
    sys.path.insert(0, str(ROOT / "tests" / "padding_free"))
    try:
        import padding_free_cases
    finally:
        sys.path.remove(str(ROOT / "tests" / "padding_free"))
    return padding_free_cases


def qwen2_5_vl(tmp_path, monkeypatch):
    """The hub id in a local cache holding a tiny Qwen2.5-VL processor and the config of the
    tiny random ``model``; ``samples`` as prompts with their images; a batch of them."""
    from huggingface_hub import constants

    from mmrope_qwen_vl.examples import image_samples

    cases = padding_free_cases()
    processor, model = cases.processor_of("Qwen2.5-VL"), cases.tiny_model("Qwen2.5-VL")
    repo = tmp_path / f"models--{HUB_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    processor.save_pretrained(snapshot)
    model.config.save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    calls = image_samples(processor, random.Random(0))
    engine = RopeEngine.from_processor(processor, model.config)
    input_ids, attention_mask, multi_modal_inputs = engine.batch([processor(**call) for call in calls])
    return {"samples": [(call["text"][0], call["images"]) for call in calls], "model": model.eval(),
            "input_ids": input_ids, "attention_mask": attention_mask, "multi_modal_inputs": multi_modal_inputs,
            "response_mask": torch.zeros_like(attention_mask), "RopeEngine": RopeEngine}


def packing(tmp_path, monkeypatch):
    """Three Qwen2-VL samples, one processor call each, and two rows to pack them in."""
    from mmrope_qwen_vl.examples import build, image_samples

    processor, config = build("Qwen2-VL")
    engine = RopeEngine.from_processor(processor, config)
    rng = random.Random(0)
    outputs = [processor(**call) for call in image_samples(processor, rng) + image_samples(processor, rng)[:1]]
    rows = [output["input_ids"][0] for output in outputs]
    return {"engine": engine, "outputs": outputs, "torch": torch, "itertools": itertools,
            "packs": [rows[:2], rows[2:]], "width": len(rows[0]) + len(rows[1]) + 3,
            "pad_token_id": processor.tokenizer.pad_token_id}


def checkpoint(tmp_path, monkeypatch):
    """A checkpoint directory (processor and config, no weights) and its processor."""
    from transformers import AutoConfig

    from mmrope_qwen_vl.examples import build

    processor, config = build("Qwen2-VL")
    processor.save_pretrained(tmp_path)
    config.save_pretrained(tmp_path)
    return {"processor": processor, "path": str(tmp_path), "AutoConfig": AutoConfig, "RopeEngine": RopeEngine}


def rollout(tmp_path, monkeypatch):
    """A checkpoint directory of a model type the transformers plugin binds (GLM-OCR), and its processor."""
    from transformers import AutoConfig

    from mmrope_transformers import examples

    processor, config = examples.build(examples.spec_of("glm_ocr"))
    processor.save_pretrained(tmp_path)
    config.save_pretrained(tmp_path)
    return {"processor": processor, "path": str(tmp_path), "AutoConfig": AutoConfig, "RopeEngine": RopeEngine}


SETUPS = {"qwen2_5_vl": qwen2_5_vl, "packing": packing, "checkpoint": checkpoint, "rollout": rollout,
          "": lambda *_: {}}
#: what each page's snippets leave behind, checked after they ran
LEFT = {"README.md": {"position_ids": (4, 2, None), "positions": (3, 2, None)},
        "packing.md": {"position_ids": (2, 4, None)}, "parity.md": {"position_ids": (2, 4, None)}}


def test_every_snippet_is_run_or_marked():
    runs = [setup for page in PAGES if page != TAKEN_FROM_EXAMPLES for setup, _ in snippets(page)]
    assert set(runs) <= {*SETUPS, "compile"}, set(runs) - {*SETUPS, "compile"}
    assert len([setup for setup in runs if setup != "compile"]) >= 8


@pytest.mark.parametrize("page", [page for page in PAGES if page != TAKEN_FROM_EXAMPLES and snippets(page)],
                         ids=lambda page: str(page.relative_to(ROOT)))
def test_the_snippets_of_the_page_run(page, tmp_path, monkeypatch):
    namespace: dict = {"__name__": f"snippets of {page.name}"}
    prepared = set()
    for index, (setup, code) in enumerate(snippets(page)):
        compiled = compile(code, f"{page.relative_to(ROOT)} snippet {index}", "exec")
        if setup == "compile":
            continue
        if setup not in prepared:
            namespace.update(SETUPS[setup](tmp_path / f"setup-{index}", monkeypatch))
            prepared.add(setup)
        with processors_without_torchvision(), torch.no_grad():  # (no torchvision here to build video processors)
            exec(compiled, namespace)
    for name, shape in LEFT.get(page.name, {}).items():
        value = namespace[name]
        assert all(want is None or got == want for got, want in zip(value.shape, shape)), (name, value.shape)
