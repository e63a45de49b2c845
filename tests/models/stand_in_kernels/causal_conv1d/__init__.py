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
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError("activation must be None, silu, or swish")
    if seq_idx is None:
        return _convolution(x, weight, bias, activation)
    _check_seq_idx(x, seq_idx, return_final_states)
    return torch.cat([torch.cat([_convolution(x[row:row + 1, :, start:stop], weight, bias, activation)
                                 for start, stop in itertools.pairwise(_runs(index))], dim=-1)
                      for row, index in enumerate(seq_idx)])


def _runs(index):
    """Where the runs of one sequence index start, and the end."""
    return [0, *(torch.nonzero(index[1:] != index[:-1]).flatten() + 1).tolist(), index.numel()]


def _check_seq_idx(x, seq_idx, return_final_states):
    """What causal-conv1d 1.7.0 checks of ``seq_idx`` (csrc/causal_conv1d.cpp, causal_conv1d_interface.py):
    an int32 tensor of shape (batch, seqlen) on x's device, x in channel-last layout, no final states.
    Its Python function makes ``seq_idx`` contiguous before the check; the stand-in asks it given so."""
    if return_final_states:
        raise AssertionError("If seq_idx is not None, we don't return final_states_out")
    if not isinstance(seq_idx, torch.Tensor) or seq_idx.dtype != torch.int32:
        raise RuntimeError(f"seq_idx must be an int32 tensor, got {getattr(seq_idx, 'dtype', type(seq_idx))}")
    if not seq_idx.is_contiguous():
        raise RuntimeError("seq_idx must be contiguous")
    if tuple(seq_idx.shape) != (x.shape[0], x.shape[-1]):
        raise RuntimeError(f"seq_idx must have shape (batch_size, seqlen) = {(x.shape[0], x.shape[-1])}, "
                           f"got {tuple(seq_idx.shape)}")
    if seq_idx.device != x.device:
        raise RuntimeError(f"seq_idx is on {seq_idx.device}, x on {x.device}")
    if not (x.stride(1) == 1 and x.stride(2) > 1):
        raise RuntimeError("seq_idx is only supported for channel last layout")


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    import transformers.models.qwen3_5.modeling_qwen3_5 as qwen3_5

    # transformers' own PyTorch update: under its own name where the module imports this stand-in
    update = getattr(qwen3_5, "torch_causal_conv1d_update", None) or inspect.unwrap(qwen3_5.causal_conv1d_update)
    return update(x, conv_state, weight, bias, activation)
