"""Stand-in of flash-linear-attention's gated delta rule: with ``cu_seqlens``, each segment through
transformers' own PyTorch rule, as the kernel computes each sequence of a varlen batch."""

import inspect
import itertools

import torch


def _torch_rule(name):
    import transformers.models.qwen3_5.modeling_qwen3_5 as qwen3_5

    return inspect.unwrap(getattr(qwen3_5, name))


def _per_segment(rule, q, k, v, g, beta, cu_seqlens, **kwargs):
    if q.shape[2] != k.shape[2] or v.shape[2] % q.shape[2]:
        raise ValueError(f"q and k must have the same number of heads, and v a multiple of them: "
                         f"{q.shape[2]}, {k.shape[2]}, {v.shape[2]}")
    if cu_seqlens is None:
        return rule(q, k, v, g=g, beta=beta, **kwargs)
    _check_cu_seqlens(q, cu_seqlens, kwargs.get("initial_state"))
    bounds = cu_seqlens.tolist()
    outputs, states = zip(*(rule(q[:, start:stop], k[:, start:stop], v[:, start:stop], g=g[:, start:stop],
                                 beta=beta[:, start:stop], **kwargs) for start, stop in itertools.pairwise(bounds)))
    return torch.cat(outputs, dim=1), None if states[-1] is None else torch.cat(states)


def _check_cu_seqlens(q, cu_seqlens, initial_state):
    """What flash-linear-attention 0.6.0 asks of a varlen call (fla/ops/gated_delta_rule/chunk.py): the
    sequences flattened into a batch of 1, ``cu_seqlens`` their 1-D integer offsets from 0 to the
    row's length on q's device, one initial state per sequence."""
    if q.shape[0] != 1:
        raise ValueError(f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`."
                         f"Please flatten variable-length inputs before processing.")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
        raise TypeError(f"cu_seqlens must be a 1-D integer tensor, got {cu_seqlens!r}")
    if cu_seqlens.device != q.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device}, q on {q.device}")
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or bounds[-1] != q.shape[1] or any(b < a for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"cu_seqlens {bounds} are not offsets from 0 to the row's {q.shape[1]} tokens")
    if initial_state is not None and initial_state.shape[0] != len(bounds) - 1:
        raise ValueError(f"The number of initial states is expected to be equal to the number of input sequences, "
                         f"i.e., {len(bounds) - 1} rather than {initial_state.shape[0]}.")


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False):
    return _per_segment(_torch_rule("torch_chunk_gated_delta_rule"), q, k, v, g, beta, cu_seqlens,
                        initial_state=initial_state, output_final_state=output_final_state,
                        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                                     cu_seqlens=None, use_qk_l2norm_in_kernel=False):
    return _per_segment(_torch_rule("torch_recurrent_gated_delta_rule"), q, k, v, g, beta, cu_seqlens,
                        initial_state=initial_state, output_final_state=output_final_state,
                        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
