"""What the launcher tests (test_launchers.py) put in every Python process the frameworks start,
through PYTHONPATH: this machine's CPU torch has no torchvision or torchaudio build, which the
frameworks import for media no test sample holds (videos, audio files). Nothing here changes how
a framework trains. It also counts the calls into mmrope's engine, per process, into the file
named by MMROPE_ENGINE_CALLS."""

import atexit
import importlib
import importlib.machinery
import os
import sys
import types
from pathlib import Path


def _empty_torchaudio() -> None:
    """LLaMA-Factory's multimodal plugins import torchaudio to read audio files."""
    try:
        import torchaudio  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("torchaudio")
        stand_in.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)  # found, but not installed
        sys.modules["torchaudio"] = stand_in


def _import_without_torchvision(module: str) -> None:
    """Import ``module``, which imports torchvision at the top for its video code, against empty
    stand-ins (every name read from them is an empty class), then take them away."""
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return

    def missing(name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})

    stand_ins = {name: types.ModuleType(name) for name in ("torchvision", "torchvision.transforms")}
    for stand_in in stand_ins.values():
        stand_in.__getattr__ = missing  # type: ignore[method-assign]
    stand_ins["torchvision"].transforms = stand_ins["torchvision.transforms"]  # type: ignore[attr-defined]
    sys.modules.update(stand_ins)
    try:
        importlib.import_module(module)
    except ImportError:
        pass  # not installed in this environment: the framework that needs it is not run
    finally:
        for name in stand_ins:
            del sys.modules[name]


def _count_engine_calls(path: str) -> None:
    from mmrope_core.engine import RopeEngine

    calls = {"count": 0}
    for name in ("compute_position_ids", "get_rope_index"):
        method = getattr(RopeEngine, name)

        def counted(*args, __method=method, **kwargs):
            calls["count"] += 1
            return __method(*args, **kwargs)

        setattr(RopeEngine, name, counted)

    def write() -> None:
        with open(path, "a") as file:
            file.write(f"{os.getpid()} {calls['count']}\n")

    atexit.register(write)


_empty_torchaudio()
sys.path.insert(0, str(Path(__file__).parents[1]))
try:
    from cases import loading_without_torchvision

    _processors = loading_without_torchvision()  # kept open for the process: transformers builds processors
    _processors.__enter__()
finally:
    sys.path.pop(0)
_import_without_torchvision("qwen_vl_utils")  # ms-swift's Qwen templates read images with it
if os.environ.get("MMROPE_ENGINE_CALLS"):
    _count_engine_calls(os.environ["MMROPE_ENGINE_CALLS"])
