"""Stand-in of causal-conv1d: with ``seq_idx``, each run of one sequence index through the
depthwise causal convolution that transformers' PyTorch path computes, as the kernel keeps the
sequences of a packed row apart."""

import inspect
import itertools

import torch
import torch.nn.functional as F

__version__ = "1.7.0"


def _convolution(x, weight, bias, activation):
    """transformers' PyTorch convolution of linear attention: depthwise, causal, then the activation."""
    out = F.conv1d(x, weight.unsqueeze(1), bias, padding=weight.shape[-1] - 1, groups=x.shape[1])[..., : x.shape[-1]]
    return F.silu(out) if activation in ("silu", "swish") else out


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    if seq_idx is None:
        return _convolution(x, weight, bias, activation)
    index = seq_idx[0]
    bounds = [0, *(torch.nonzero(index[1:] != index[:-1]).flatten() + 1).tolist(), index.numel()]
    return torch.cat([_convolution(x[..., start:stop], weight, bias, activation)
                      for start, stop in itertools.pairwise(bounds)], dim=-1)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    import transformers.models.qwen3_5.modeling_qwen3_5 as qwen3_5

    # transformers' own PyTorch update: under its own name where the module imports this stand-in
    update = getattr(qwen3_5, "torch_causal_conv1d_update", None) or inspect.unwrap(qwen3_5.causal_conv1d_update)
    return update(x, conv_state, weight, bias, activation)
