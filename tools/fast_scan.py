"""Training-time selective scan for the Mamba models on CPU.

transformers' sequential Mamba path is exact but slow to differentiate (every
time-step slice gets its own full-size gradient buffer), and mamba.py's
parallel scan is memory-bound here.  This autograd function runs the same
recurrence

    h_t = a_t * h_{t-1} + b_t,      y_t[c] = sum_n h_t[c, n] * C_t[n]

with a plain loop over time in forward and a hand-written reverse loop in
backward, never materialising the [B, D, T, N] discretised tensors (tiny-mamba),
and runs the time-invariant tiny-lti as an FFT convolution.  It is used only while training (train.py); evaluation and goldens
run transformers' own code (or ref_lti_mamba's loop).
"""
from __future__ import annotations

import torch
import torch.nn as nn


class SelectiveScan(torch.autograd.Function):
    """Fused selective scan.  Inputs: dt [T, B, D] (after softplus), A [D, N]
    (negative), Bm [T, B, N], C [T, B, N], u [T, B, D].  Output y [T, B, D]:
        a_t = exp(dt_t * A),  h_t = a_t * h_{t-1} + (dt_t * u_t) * Bm_t,  y_t = h_t . C_t
    Only h_t is stored ([T, B, D, N]); a_t is recomputed in backward."""

    @staticmethod
    def forward(ctx, dt, A, Bm, C, u):
        t_len, bsz, d = u.shape
        n = A.shape[1]
        hs = torch.empty(t_len, bsz, d, n, dtype=u.dtype, device=u.device)
        y = torch.empty(t_len, bsz, d, dtype=u.dtype, device=u.device)
        h = torch.zeros(bsz, d, n, dtype=u.dtype, device=u.device)
        dtu = dt * u
        for i in range(t_len):
            a = torch.exp(dt[i, :, :, None] * A)
            h = torch.addcmul(dtu[i, :, :, None] * Bm[i, :, None, :], a, h)
            hs[i] = h
            y[i] = (h * C[i, :, None, :]).sum(-1)
        ctx.save_for_backward(dt, A, Bm, C, u, hs)
        return y

    @staticmethod
    def backward(ctx, gy):
        dt, A, Bm, C, u, hs = ctx.saved_tensors
        t_len, bsz, d = u.shape
        dtu = dt * u
        g_dt = torch.empty_like(dt)
        g_dtu = torch.empty_like(dt)
        g_Bm = torch.empty_like(Bm)
        g_C = torch.empty_like(C)
        g_A = torch.zeros_like(A)
        gh = torch.zeros_like(hs[0])
        zero = torch.zeros_like(hs[0])
        for i in range(t_len - 1, -1, -1):
            h = hs[i]
            g_C[i] = (gy[i, :, :, None] * h).sum(1)
            gh = torch.addcmul(gh, gy[i, :, :, None], C[i, :, None, :])   # total dL/dh_i
            a = torch.exp(dt[i, :, :, None] * A)
            h_prev = hs[i - 1] if i > 0 else zero
            ga_a = gh * h_prev * a                                      # dL/d(dt*A) elementwise
            g_dt[i] = (ga_a * A).sum(-1)
            g_A += (ga_a * dt[i, :, :, None]).sum(0)
            g_dtu[i] = (gh * Bm[i, :, None, :]).sum(-1)
            g_Bm[i] = (gh * dtu[i, :, :, None]).sum(1)
            gh = gh * a
        g_dt = g_dt + g_dtu * u
        g_u = g_dtu * dt
        return g_dt, g_A, g_Bm, g_C, g_u


def lti_conv(a, bcoef, C, u):
    """Time-invariant SSM as a causal convolution (the S4 view).  a, bcoef, C:
    [D, N]; u: [B, D, T].  Kernel K[c, k] = sum_n C[c,n] * bcoef[c,n] * a[c,n]^k."""
    t_len = u.shape[-1]
    k = torch.arange(t_len, dtype=u.dtype, device=u.device)
    powers = torch.exp(torch.log(a)[:, :, None] * k)                    # [D, N, T]
    kernel = torch.einsum("dn,dnt->dt", C * bcoef, powers)
    nfft = 2 * t_len
    y = torch.fft.irfft(torch.fft.rfft(u, n=nfft) * torch.fft.rfft(kernel, n=nfft), n=nfft)
    return y[..., :t_len]


def mamba_train_forward(self, input_states, cache_params=None, cache_position=None, attention_mask=None):
    """MambaMixer.slow_forward's math (no cache) with the custom scan."""
    _, seq_len, _ = input_states.shape
    projected = self.in_proj(input_states).transpose(1, 2)
    hidden_states, gate = projected.chunk(2, dim=1)
    hidden_states = self.act(self.conv1d(hidden_states)[..., :seq_len])
    ssm_parameters = self.x_proj(hidden_states.transpose(1, 2))
    time_step, B, C = torch.split(
        ssm_parameters, [self.time_step_rank, self.ssm_state_size, self.ssm_state_size], dim=-1)
    dt = nn.functional.softplus(self.dt_proj(time_step)).transpose(1, 2)      # [B, D, T]
    A = -torch.exp(self.A_log.float())
    y = SelectiveScan.apply(dt.permute(2, 0, 1).contiguous(), A, B.transpose(0, 1).contiguous(),
                            C.transpose(0, 1).contiguous(),
                            hidden_states.permute(2, 0, 1).contiguous()).permute(1, 2, 0)
    y = (y + hidden_states * self.D[None, :, None]) * self.act(gate)
    return self.out_proj(y.transpose(1, 2))


def lti_train_forward(self, input_states, cache_params=None, cache_position=None, attention_mask=None):
    """LTIMambaMixer.slow_forward's math (no cache) with the custom scan."""
    bsz, seq_len, _ = input_states.shape
    projected = self.in_proj(input_states).transpose(1, 2)
    u, gate = projected.chunk(2, dim=1)
    u = self.act(self.conv1d(u)[..., :seq_len])
    delta = nn.functional.softplus(self.dt)
    dA = torch.exp(-torch.exp(self.A_log) * delta[:, None])                     # [D, N]
    y = lti_conv(dA, delta[:, None] * self.B, self.C, u)
    y = (y + u * self.D[None, :, None]) * self.act(gate)
    return self.out_proj(y.transpose(1, 2))


def install(model) -> None:
    """Route every Mamba mixer of `model` through the training scan."""
    import types
    from ref_lti_mamba import LTIMambaMixer
    for layer in model.backbone.layers:
        mx = layer.mixer
        fn = lti_train_forward if isinstance(mx, LTIMambaMixer) else mamba_train_forward
        mx.forward = types.MethodType(fn, mx)


def uninstall(model) -> None:
    for layer in model.backbone.layers:
        if "forward" in layer.mixer.__dict__:
            del layer.mixer.forward
