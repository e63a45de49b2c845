"""Stand-in of flash-linear-attention's gated delta rule: with ``cu_seqlens``, each segment through
transformers' own PyTorch rule, as the kernel computes each sequence of a varlen batch."""

import inspect
import itertools

import torch


def _torch_rule(name):
    import transformers.models.qwen3_5.modeling_qwen3_5 as qwen3_5

    return inspect.unwrap(getattr(qwen3_5, name))


def _per_segment(rule, q, k, v, g, beta, cu_seqlens, **kwargs):
    if cu_seqlens is None:
        return rule(q, k, v, g=g, beta=beta, **kwargs)
    bounds = cu_seqlens.tolist()
    outputs, states = zip(*(rule(q[:, start:stop], k[:, start:stop], v[:, start:stop], g=g[:, start:stop],
                                 beta=beta[:, start:stop], **kwargs) for start, stop in itertools.pairwise(bounds)))
    return torch.cat(outputs, dim=1), None if states[-1] is None else torch.cat(states)


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
