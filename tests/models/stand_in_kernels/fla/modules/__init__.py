"""Stand-in of flash-linear-attention's fused gated RMS norm: what transformers' own PyTorch gated
RMS norm of linear attention computes (the norm, its weight, then the gate through SiLU)."""

import torch


class FusedRMSNormGated(torch.nn.Module):
    def __init__(self, hidden_size, elementwise_affine=True, eps=1e-5, activation="swish", device=None, dtype=None):
        super().__init__()
        if activation not in ("swish", "silu"):
            raise NotImplementedError(f"the stand-in gates through SiLU only, not {activation!r}")
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype))  # on the CPU, whatever device is asked
        self.variance_epsilon = eps

    def forward(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

        return Qwen3_5RMSNormGated.forward(self, x, g)
