"""Stand-in of causal-conv1d: with ``seq_idx``, each run of one sequence index through
transformers' own PyTorch convolution, as the kernel keeps the sequences of a packed row apart."""

import inspect
import itertools

import torch

__version__ = "1.7.0"


def _torch_function(name):
    import transformers.models.qwen3_5.modeling_qwen3_5 as qwen3_5

    return inspect.unwrap(getattr(qwen3_5, name))


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    convolution = _torch_function("causal_conv1d_fn")
    if seq_idx is None:
        return convolution(x, weight, bias, activation=activation)
    index = seq_idx[0]
    bounds = [0, *(torch.nonzero(index[1:] != index[:-1]).flatten() + 1).tolist(), index.numel()]
    return torch.cat([convolution(x[..., start:stop], weight, bias, activation=activation)
                      for start, stop in itertools.pairwise(bounds)], dim=-1)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    return _torch_function("causal_conv1d_update")(x, conv_state, weight, bias, activation)
