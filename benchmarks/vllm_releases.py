"""Which of vLLM's M-RoPE position functions changed between two releases, read from their
unzipped wheels (never installed): what decides whether a new release gets a convention of its own.

    pip download vllm==0.34.0 --no-deps -d anchors
    python -m zipfile -e anchors/vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl anchors/vllm-0.34.0
    python benchmarks/vllm_releases.py anchors/vllm-0.33.0 anchors/vllm-0.34.0

From every model class that defines ``get_mrope_input_positions`` in either release, the decode
positions (``MRotaryEmbedding.get_next_input_positions_tensor`` in 0.33, the model runner's
``_prepare_rope_positions_kernel`` in 0.34, which vllm_anchor.py runs in Python), the placeholder ordering
(``argsort_mm_positions``), and the Omni audio-in-video token layouts and field factories that
vllm_anchor.py loads, it follows every method and function they reach (through ``self``, base
classes and vLLM modules they import from, as vllm_anchor.py resolves them) and compares their
syntax trees, without docstrings and annotations. Prints the classes found in one release only and
every function that differs or exists in one release only. Then run ``vllm_side_by_side.py
--source`` (both modes) on the newer release to compare positions.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from vllm_anchor import _MODELS, FAMILIES, _attributes_of, _Extractor, _names_of, _without_annotations

ROOTS = [  # (file, class or None for a module function, name)
    ("vllm/model_executor/layers/rotary_embedding/mrope.py", "MRotaryEmbedding", "get_next_input_positions_tensor"),
    ("vllm/model_executor/layers/rotary_embedding/mrope.py", "MRotaryEmbedding", "get_next_input_positions"),
    ("vllm/v1/worker/gpu/mm/rope.py", None, "_prepare_rope_positions_kernel"),  # 0.34's decode positions
    ("vllm/multimodal/utils.py", None, "argsort_mm_positions"),
    *[(f"{_MODELS}/{family.fields[0]}.py", None, family.fields[1]) for family in FAMILIES.values()],
    *[(f"{_MODELS}/{family.module}.py", *family.audio_in_video) for family in FAMILIES.values()
      if family.audio_in_video],
]


def main() -> None:
    old, new = (Path(arg) for arg in sys.argv[1:3])
    found = {source: mrope_classes(source) for source in (old, new)}
    for source, other in ((old, new), (new, old)):
        only = sorted(set(found[source]) - set(found[other]))
        print(f"classes with get_mrope_input_positions only in {source.name}: {', '.join(c for _, c in only) or 'none'}")
    common = sorted(set(found[old]) & set(found[new]))
    roots = ROOTS + [(path, cls, "get_mrope_input_positions") for path, cls in common]
    trees = {source: reached(source, roots) for source in (old, new)}
    names = sorted(set(trees[old]) | set(trees[new]))
    changed = [name for name in names if trees[old].get(name) != trees[new].get(name)]
    print(f"{len(common)} classes in both; {len(names)} functions and methods reached, {len(changed)} differ:")
    for name in changed:
        state = ("only in " + new.name) if name not in trees[old] else ("only in " + old.name) if name not in trees[new] \
            else "changed"
        print(f"    {name[0]}: {name[1]} ({state})")


def mrope_classes(source: Path) -> list[tuple[str, str]]:
    """``(file, class)`` of every model class defining ``get_mrope_input_positions``."""
    out = []
    for path in sorted((source / _MODELS).glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(isinstance(item, ast.FunctionDef) and
                                                      item.name == "get_mrope_input_positions" for item in node.body):
                out.append((str(path.relative_to(source)), node.name))
    return out


def reached(source: Path, roots) -> dict[tuple[str, str], str]:
    """``(file, qualified name) -> normalised tree`` of every function the roots reach."""
    code = _Extractor(source, {})
    out: dict[tuple[str, str], str] = {}
    wanted = list(roots)
    while wanted:
        path, cls, name = wanted.pop()
        if not (source / path).is_file():
            continue
        try:
            where, node = code._method(path, cls, name) if cls else (path, code._top_level(path, name))
        except LookupError:
            continue
        if not isinstance(node, ast.FunctionDef):
            continue
        key = (where, f"{cls}.{name}" if cls else name)
        if key in out:
            continue
        out[key] = ast.dump(_without_docstrings(_without_annotations(node)))
        if cls:
            wanted += [(path, cls, method) for method in _attributes_of(node, ("self", cls))]
        for free in _names_of(node):
            defined = code._defined_in(where, free)
            if defined is not None:
                wanted.append((defined, None, free))
    return out


def _without_docstrings(node: ast.FunctionDef) -> ast.FunctionDef:
    for child in ast.walk(node):
        body = getattr(child, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            child.body = body[1:] or [ast.Pass()]
    return node


if __name__ == "__main__":
    main()
