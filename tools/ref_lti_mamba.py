"""tiny-lti: the Mamba stack with the selection mechanism removed.

In Mamba the step size delta and the matrices B and C are computed from the
current input (x_proj, dt_proj).  Here they are learned per-channel constants,
as in S4D: for every inner channel c

    delta[c] = softplus(dt[c])             dt: [d_inner]
    B[c, :]  (state_size values)           B:  [d_inner, N]
    C[c, :]  (state_size values)           C:  [d_inner, N]

so the recurrence h_t = exp(delta*A) * h_{t-1} + delta*B*u_t, y_t = C.h_t + D*u_t
is linear time-invariant: the same for every token, whatever its content.
Everything else (in_proj with the gate, causal depthwise conv, SiLU, A_log, D,
out_proj, RMSNorm, residuals) is unchanged from transformers' MambaMixer, which
this class subclasses; x_proj and dt_proj are removed.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
from transformers import MambaConfig, MambaForCausalLM
from transformers.models.mamba import modeling_mamba as mm


class LTIMambaMixer(mm.MambaMixer):
    def __init__(self, config: MambaConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        del self.x_proj
        del self.dt_proj
        d, n = self.intermediate_size, self.ssm_state_size
        # dt initialised like Mamba's dt bias: softplus(dt) log-uniform in [1e-3, 1e-1]
        g = torch.Generator().manual_seed(1000 + layer_idx)
        step = torch.exp(torch.rand(d, generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt = nn.Parameter(step + torch.log(-torch.expm1(-step)))
        self.B = nn.Parameter(torch.randn(d, n, generator=g) / math.sqrt(n))
        self.C = nn.Parameter(torch.randn(d, n, generator=g) / math.sqrt(n))

    def forward(self, hidden_states, cache_params=None, cache_position=None, attention_mask=None):
        return self.slow_forward(hidden_states, cache_params, cache_position, attention_mask)

    def slow_forward(self, input_states, cache_params=None, cache_position=None, attention_mask=None):
        batch_size, seq_len, _ = input_states.shape
        dtype = input_states.dtype
        projected = self.in_proj(input_states).transpose(1, 2)
        hidden_states, gate = projected.chunk(2, dim=1)              # [B, d_inner, T] each
        if cache_params is not None:
            ssm_state = cache_params.ssm_states[self.layer_idx].clone().to(hidden_states.device)
            if cache_position.shape[0] == self.conv_kernel_size:
                conv_state = nn.functional.pad(hidden_states, (self.conv_kernel_size - hidden_states.shape[-1], 0))
                cache_params.update_conv_state(self.layer_idx, conv_state, cache_position)
                hidden_states = self.act(self.conv1d(hidden_states)[..., :seq_len])
            else:
                conv_state = cache_params.update_conv_state(self.layer_idx, hidden_states, cache_position)
                hidden_states = torch.sum(conv_state * self.conv1d.weight[:, 0, :], dim=-1)
                if self.use_conv_bias:
                    hidden_states = hidden_states + self.conv1d.bias
                hidden_states = self.act(hidden_states).to(dtype).unsqueeze(-1)
        else:
            ssm_state = torch.zeros(batch_size, self.intermediate_size, self.ssm_state_size,
                                    device=hidden_states.device, dtype=dtype)
            hidden_states = self.act(self.conv1d(hidden_states)[..., :seq_len])
        delta = nn.functional.softplus(self.dt)                      # [d_inner]
        A = -torch.exp(self.A_log)                                   # [d_inner, N]
        dA = torch.exp(A * delta[:, None])                           # [d_inner, N]
        dB = delta[:, None] * self.B                                 # [d_inner, N]
        u = hidden_states                                            # [B, d_inner, T]
        # sequential recurrence (training uses the equivalent convolution, fast_scan.py)
        ys = []
        for i in range(seq_len):
            ssm_state = dA * ssm_state + dB * u[:, :, i, None]
            ys.append((ssm_state * self.C).sum(-1))
        y = torch.stack(ys, dim=-1)
        if cache_params is not None:
            cache_params.ssm_states[self.layer_idx].copy_(ssm_state)
        y = (y + u * self.D[None, :, None]) * self.act(gate)
        return self.out_proj(y.transpose(1, 2))


def build_lti(config: MambaConfig) -> MambaForCausalLM:
    model = MambaForCausalLM(config)
    for i, layer in enumerate(model.backbone.layers):
        old = layer.mixer
        new = LTIMambaMixer(config, i)
        # keep the (seeded) initialisation of the shared parameters
        for name in ("in_proj", "conv1d", "out_proj"):
            getattr(new, name).load_state_dict(getattr(old, name).state_dict())
        new.A_log.data.copy_(old.A_log.data)
        new.D.data.copy_(old.D.data)
        layer.mixer = new
    return model
