"""Linear attention trains packed rows exactly once its kernels take the boundaries. The kernels
need a CUDA GPU; in a child process, stand-ins that honour their documented varlen arguments
(``stand_in_kernels/``: each segment through transformers' own PyTorch computations) and refuse
what the real kernels refuse take their place, so that what is tested is what mmrope hands the model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.differential

HERE = Path(__file__).parent
CASES = ("Qwen3.5", "Qwen3.5-MoE")

CHILD = f"""
import sys
sys.path[:0] = [{str(HERE / "stand_in_kernels")!r}, {str(HERE)!r}]
import torch
import transformers.utils.import_utils as import_utils
# what transformers and torch answer on a GPU with the kernels (some releases build the fused
# norm on the current CUDA device; the stand-in stays on the CPU)
import_utils.is_flash_linear_attention_available = lambda: True
import_utils.is_causal_conv1d_available = lambda: True
torch.cuda.current_device = lambda: 0

from test_packed_rows import LOGITS, by_hand, case, rows_of, segments_of, trains_as_its_samples_alone_or_is_refused
from mmrope_core.collators import PackedCollator
from mmrope_core.segments import packed_row_support

# the stand-ins refuse what the real kernels refuse: int64 or (L,) seq_idx, a varlen batch of 2
import causal_conv1d
from fla.ops.gated_delta_rule import chunk_gated_delta_rule
x, weight = torch.randn(1, 6, 4).transpose(1, 2), torch.randn(4, 3)
for bad in (torch.zeros(1, 6, dtype=torch.long), torch.zeros(6, dtype=torch.int32),
            torch.zeros(1, 12, dtype=torch.int32)[:, ::2]):
    try:
        causal_conv1d.causal_conv1d_fn(x, weight, seq_idx=bad)
    except RuntimeError:
        pass
    else:
        raise AssertionError(f"the causal-conv1d stand-in took seq_idx {{bad.dtype}} {{tuple(bad.shape)}}")
q = torch.randn(2, 6, 2, 4)
try:
    chunk_gated_delta_rule(q, q, q, torch.zeros(2, 6, 2), torch.ones(2, 6, 2), cu_seqlens=torch.tensor([0, 3, 6]))
except ValueError:
    pass
else:
    raise AssertionError("the flash-linear-attention stand-in took a varlen batch of 2")

for name in {CASES!r}:
    tiny, engine = case(name, None)
    assert packed_row_support(engine).boundaries == "linear_attention", name
    for samples in rows_of(tiny):
        trains_as_its_samples_alone_or_is_refused(tiny, engine, samples)
        # without seq_idx the convolution still runs from one segment into the next
        batch = PackedCollator(engine)(samples)
        assert batch["seq_idx"].dtype == torch.int32 and batch["seq_idx"].is_contiguous()
        assert batch["seq_idx"].shape == batch["input_ids"].shape and batch["cu_seq_lens_q"].dim() == 1
        del batch["seq_idx"]
        with torch.no_grad():
            logits = tiny.model(**batch).logits[0]
            own = [tiny.model(**sample, use_cache=False).logits[0] for sample in samples]
        assert not all(torch.allclose(mine, theirs, **LOGITS) for mine, theirs in zip(segments_of(logits, samples), own))
    print(name, "exact with the boundaries")
"""


def test_linear_attention_with_kernels_taking_the_boundaries_trains_packed_rows_exactly():
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for name in CASES:
        assert f"{name} exact with the boundaries" in result.stdout
