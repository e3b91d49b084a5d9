"""A pure-torch stand-in for hfnn's LSTM ops (src/, kernels/lstm/), so that hfnn.nn.LSTM's glue (layers,
directions, batch_first, states, dropout, autograd, the choice of variant, the fall-backs, dispatch
routing) is tested on the CPU, where the real ops do not run. Same schema as the real ops:

    lstm_layer_fwd(x, w_ih, w_hh, b_ih?, b_hh?, h0?, c0?, reverse, variant='') -> (y, h_n, c_n, workspace)
    lstm_layer_bwd(dy, dh_n?, dc_n?, x, w_ih, w_hh, h0?, c0?, workspace, reverse, variant='')
        -> (dx, dw_ih, dw_hh, db, dh0, dc0)
    lstm_supports(x, w_hh, variant) -> bool
    lstm_variants() -> list[str]
    lstm_choose(input, hidden, layers, batch, steps, dtype, bidirectional, batch_first, bias, dropout) -> str

One layer in one direction, x time-major [T, B, I]. The forward keeps what its backward needs in the
workspace (float32: the gates after their activations, then c_t), as the real kernels do, and the
backward is the hand-written recurrence over it (not autograd), so a glue that hands the backward the
wrong workspace, direction or state fails the tests. Every call is logged (StandIn.log).
"""
from __future__ import annotations

import torch

VARIANTS = ["persistent", "steps"]


class StandIn:
    """The ops, with what they answer configurable: supports(x, w_hh, variant) -> bool and the table
    (a dict from lstm_choose's argument tuple, less nothing, to a winner; "" for keys not in it)."""

    def __init__(self, supports=None, table=None):
        self.supports_fn = supports or (lambda x, w_hh, variant: variant in VARIANTS)
        self.table = table or {}
        self.log: list[tuple] = []

    def install(self, monkeypatch) -> "StandIn":
        for name in ("lstm_layer_fwd", "lstm_layer_bwd", "lstm_supports", "lstm_variants", "lstm_choose"):
            monkeypatch.setattr(torch.ops.hfnn, name, getattr(self, name), raising=False)
        return self

    def lstm_variants(self):
        return list(VARIANTS)

    def lstm_supports(self, x, w_hh, variant):
        return variant in VARIANTS and bool(self.supports_fn(x, w_hh, variant))

    def lstm_choose(self, input, hidden, layers, batch, steps, dtype, bidirectional, batch_first, bias, dropout):
        key = (input, hidden, layers, batch, steps, dtype, bidirectional, batch_first, bias, dropout)
        self.log.append(("choose", key))
        return self.table.get(key, "")

    def lstm_layer_fwd(self, x, *args):
        with torch.autocast(x.device.type, enabled=False):  # a kernel: no autocast inside (its matmuls)
            return self._fwd(x, *args)

    def lstm_layer_bwd(self, dy, *args):
        with torch.autocast(dy.device.type, enabled=False):
            return self._bwd(dy, *args)

    def _fwd(self, x, w_ih, w_hh, b_ih, b_hh, h0, c0, reverse, variant=""):
        assert variant in VARIANTS, variant
        assert x.dim() == 3 and x.is_contiguous() and w_ih.is_contiguous() and w_hh.is_contiguous()
        assert x.dtype == w_ih.dtype == w_hh.dtype
        self.log.append(("fwd", variant, bool(reverse), tuple(x.shape), h0 is not None))
        steps, batch, _ = x.shape
        hidden = w_hh.shape[1]
        xs = x.flip(0) if reverse else x
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32  # 16-bit: float32 accumulation
        pre = xs.to(acc) @ w_ih.to(acc).t()
        if b_ih is not None:
            pre = pre + b_ih.to(acc) + b_hh.to(acc)
        h = h0.to(acc) if h0 is not None else x.new_zeros(batch, hidden, dtype=acc)
        c = c0.to(acc) if c0 is not None else x.new_zeros(batch, hidden, dtype=acc)
        ys, acts, cs = [], [], []
        for t in range(steps):
            i, f, g, o = (pre[t] + h @ w_hh.to(acc).t()).chunk(4, dim=1)
            i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
            c = f * c + i * g
            h = o * c.tanh()
            ys.append(h)
            acts.append(torch.cat([i, f, g, o], dim=1))
            cs.append(c)
        y = torch.stack(ys) if steps else x.new_zeros(0, batch, hidden)
        if reverse:
            y = y.flip(0)
        workspace = torch.cat([torch.stack(acts).flatten(), torch.stack(cs).flatten()]).float()
        return y.to(x.dtype), h.to(x.dtype), c.to(x.dtype), workspace

    def _bwd(self, dy, dh_n, dc_n, x, w_ih, w_hh, h0, c0, workspace, reverse, variant=""):
        assert variant in VARIANTS, variant
        self.log.append(("bwd", variant, bool(reverse), tuple(x.shape), dh_n is not None, dc_n is not None))
        steps, batch, _ = x.shape
        hidden = w_hh.shape[1]
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        n_acts = steps * batch * 4 * hidden
        acts = workspace[:n_acts].view(steps, batch, 4 * hidden).to(acc)
        cs = workspace[n_acts:].view(steps, batch, hidden).to(acc)
        xs, dys = (x.flip(0), dy.flip(0)) if reverse else (x, dy)
        xs, dys, w_ih_, w_hh_ = xs.to(acc), dys.to(acc), w_ih.to(acc), w_hh.to(acc)
        zeros = x.new_zeros(batch, hidden, dtype=acc)
        h_first = h0.to(acc) if h0 is not None else zeros
        c_first = c0.to(acc) if c0 is not None else zeros
        dh = dh_n.to(acc) if dh_n is not None else zeros
        dc = dc_n.to(acc) if dc_n is not None else zeros
        dgates = [None] * steps
        for t in reversed(range(steps)):
            i, f, g, o = acts[t].chunk(4, dim=1)
            c_prev = cs[t - 1] if t > 0 else c_first
            tc = cs[t].tanh()
            dh_t = dys[t] + dh
            dc_t = dc + dh_t * o * (1 - tc * tc)
            d = torch.cat([dc_t * g * i * (1 - i), dc_t * c_prev * f * (1 - f), dc_t * i * (1 - g * g),
                           dh_t * tc * o * (1 - o)], dim=1)
            dgates[t] = d
            dh = d @ w_hh_
            dc = dc_t * f
        dg = torch.stack(dgates)                                                # [T, B, 4H]
        h_all = acts[..., 3 * hidden:] * cs.tanh()                              # h_t = o * tanh(c_t)
        h_prev = torch.cat([h_first.unsqueeze(0), h_all[:-1]], dim=0)
        dx = dg @ w_ih_
        if reverse:
            dx = dx.flip(0)
        dw_ih = dg.flatten(0, 1).t() @ xs.flatten(0, 1)
        dw_hh = dg.flatten(0, 1).t() @ h_prev.flatten(0, 1)
        db = dg.sum(dim=(0, 1))
        out = (dx, dw_ih, dw_hh, db, dh, dc)
        return tuple(t.to(x.dtype) for t in out)
