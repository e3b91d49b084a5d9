// float64 CPU reference for one LSTM layer (lstm_reference.h). Slow and obvious on purpose.
#include "kernels/lstm/lstm_reference.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/lstm/lstm.h"

namespace hfnn::kernels::lstm {
namespace {

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

}  // namespace

ReferenceForward reference_forward(const ReferenceLayer& l) {
  const int64_t T = l.steps, B = l.batch, I = l.input, H = l.hidden, G = 4 * H;
  ReferenceForward f;
  f.y.assign(at(T * B * H), 0.0);
  f.gates.assign(at(T * B * G), 0.0);
  f.c.assign(at(T * B * H), 0.0);
  std::vector<double> h(at(B * H), 0.0), c(at(B * H), 0.0), pre(at(G));
  if (l.h0) h.assign(l.h0, l.h0 + B * H);
  if (l.c0) c.assign(l.c0, l.c0 + B * H);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) {
      const double* x = l.x + (t * B + b) * I;
      const double* hp = h.data() + b * H;
      for (int64_t r = 0; r < G; ++r) {
        double s = (l.b_ih ? l.b_ih[r] : 0.0) + (l.b_hh ? l.b_hh[r] : 0.0);
        for (int64_t k = 0; k < I; ++k) s += l.w_ih[r * I + k] * x[k];
        for (int64_t k = 0; k < H; ++k) s += l.w_hh[r * H + k] * hp[k];
        pre[at(r)] = s;
      }
      double* gates = f.gates.data() + (t * B + b) * G;
      for (int64_t j = 0; j < H; ++j) {
        const double i = sigmoid(pre[at(j)]), fg = sigmoid(pre[at(H + j)]);
        const double g = std::tanh(pre[at(2 * H + j)]), o = sigmoid(pre[at(3 * H + j)]);
        gates[j] = i, gates[H + j] = fg, gates[2 * H + j] = g, gates[3 * H + j] = o;
      }
    }
    // h_{t-1} is read by every row above before any h_t is written: update after the batch.
    for (int64_t b = 0; b < B; ++b) {
      const double* gates = f.gates.data() + (t * B + b) * G;
      for (int64_t j = 0; j < H; ++j) {
        const std::size_t n = at(b * H + j);
        c[n] = gates[H + j] * c[n] + gates[j] * gates[2 * H + j];
        h[n] = gates[3 * H + j] * std::tanh(c[n]);
        f.c[at(t * B * H) + n] = c[n];
        f.y[at(t * B * H) + n] = h[n];
      }
    }
  }
  f.h_n = h;
  f.c_n = c;
  return f;
}

ReferenceGrads reference_backward(const ReferenceLayer& l, const ReferenceForward& f, const double* dy,
                                  const double* dh_n, const double* dc_n) {
  const int64_t T = l.steps, B = l.batch, I = l.input, H = l.hidden, G = 4 * H;
  ReferenceGrads d;
  d.dx.assign(at(T * B * I), 0.0);
  d.dw_ih.assign(at(G * I), 0.0);
  d.dw_hh.assign(at(G * H), 0.0);
  d.db.assign(at(G), 0.0);
  // dh, dc: the gradient flowing into h_t and c_t from later steps (and from h_n, c_n at the end).
  std::vector<double> dh(at(B * H), 0.0), dc(at(B * H), 0.0), dpre(at(B * G), 0.0);
  if (dh_n) dh.assign(dh_n, dh_n + B * H);
  if (dc_n) dc.assign(dc_n, dc_n + B * H);
  for (int64_t t = T - 1; t >= 0; --t) {
    for (int64_t b = 0; b < B; ++b) {
      const double* gates = f.gates.data() + (t * B + b) * G;
      for (int64_t j = 0; j < H; ++j) {
        const std::size_t n = at(b * H + j);
        const double dht = dh[n] + (dy ? dy[at(t * B * H) + n] : 0.0);
        const double i = gates[j], fg = gates[H + j], g = gates[2 * H + j], o = gates[3 * H + j];
        const double ct = f.c[at(t * B * H) + n];
        const double cprev = t > 0 ? f.c[at((t - 1) * B * H) + n] : (l.c0 ? l.c0[n] : 0.0);
        const double tc = std::tanh(ct);
        const double dct = dc[n] + dht * o * (1.0 - tc * tc);
        double* dp = dpre.data() + b * G;
        dp[j] = dct * g * i * (1.0 - i);                  // d pre_i
        dp[H + j] = dct * cprev * fg * (1.0 - fg);        // d pre_f
        dp[2 * H + j] = dct * i * (1.0 - g * g);          // d pre_g
        dp[3 * H + j] = dht * tc * o * (1.0 - o);         // d pre_o
        dc[n] = dct * fg;                                 // into c_{t-1}
      }
    }
    for (int64_t b = 0; b < B; ++b) {
      const double* dp = dpre.data() + b * G;
      const double* x = l.x + (t * B + b) * I;
      const double* hp = t > 0 ? f.y.data() + ((t - 1) * B + b) * H : (l.h0 ? l.h0 + b * H : nullptr);
      for (int64_t r = 0; r < G; ++r) {
        d.db[at(r)] += dp[r];
        for (int64_t k = 0; k < I; ++k) d.dw_ih[at(r * I + k)] += dp[r] * x[k];
        if (hp)
          for (int64_t k = 0; k < H; ++k) d.dw_hh[at(r * H + k)] += dp[r] * hp[k];
      }
      double* dxt = d.dx.data() + (t * B + b) * I;
      for (int64_t k = 0; k < I; ++k) {
        double s = 0.0;
        for (int64_t r = 0; r < G; ++r) s += dp[r] * l.w_ih[r * I + k];
        dxt[k] = s;
      }
      for (int64_t k = 0; k < H; ++k) {  // into h_{t-1}
        double s = 0.0;
        for (int64_t r = 0; r < G; ++r) s += dp[r] * l.w_hh[r * H + k];
        dh[at(b * H + k)] = s;
      }
    }
  }
  d.dh0 = dh;
  d.dc0 = dc;
  return d;
}

}  // namespace hfnn::kernels::lstm

// ---- the reference over the kernels' parameter structs (lstm.h) ----------------------------------

namespace hfnn::kernels::lstm {
namespace {

// n elements of an array of `dtype` as doubles; empty for a null array.
std::vector<double> to_doubles(const void* p, DType dtype, int64_t n) {
  std::vector<double> out;
  if (!p) return out;
  out.resize(at(n));
  for (int64_t i = 0; i < n; ++i) out[at(i)] = host_load(p, dtype, at(i));
  return out;
}

void store(void* p, DType dtype, const std::vector<double>& v) {
  if (!p) return;
  for (std::size_t i = 0; i < v.size(); ++i) host_store(p, dtype, i, static_cast<float>(v[i]));
}

const double* data_or_null(const std::vector<double>& v) { return v.empty() ? nullptr : v.data(); }

// Time-major arrays [steps, batch, width] in reverse time order (the reverse direction as the
// forward recurrence over reversed steps); empty stays empty.
std::vector<double> reverse_steps(const std::vector<double>& v, int64_t steps) {
  if (v.empty()) return v;
  const std::size_t per = v.size() / at(steps);
  std::vector<double> out(v.size());
  for (int64_t t = 0; t < steps; ++t)
    std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(at(t) * per), per,
                out.begin() + static_cast<std::ptrdiff_t>(at(steps - 1 - t) * per));
  return out;
}

// The layer of `p` as doubles, x in processing order.
struct Layer {
  std::vector<double> x, w_ih, w_hh, b_ih, b_hh, h0, c0;
  ReferenceLayer view(const Shape& s) const {
    ReferenceLayer l;
    l.steps = s.steps, l.batch = s.batch, l.input = s.input, l.hidden = s.hidden;
    l.x = x.data(), l.w_ih = w_ih.data(), l.w_hh = w_hh.data();
    l.b_ih = data_or_null(b_ih), l.b_hh = data_or_null(b_hh), l.h0 = data_or_null(h0), l.c0 = data_or_null(c0);
    return l;
  }
};

Layer layer_of(const FwdParams& p) {
  const Shape& s = p.shape;
  const int64_t T = s.steps, B = s.batch, I = s.input, H = s.hidden;
  Layer l;
  l.x = to_doubles(p.x, s.dtype, T * B * I);
  if (p.reverse) l.x = reverse_steps(l.x, T);
  l.w_ih = to_doubles(p.w_ih, s.dtype, 4 * H * I), l.w_hh = to_doubles(p.w_hh, s.dtype, 4 * H * H);
  l.b_ih = to_doubles(p.b_ih, s.dtype, 4 * H), l.b_hh = to_doubles(p.b_hh, s.dtype, 4 * H);
  l.h0 = to_doubles(p.h0, s.dtype, B * H), l.c0 = to_doubles(p.c0, s.dtype, B * H);
  return l;
}

}  // namespace

void reference_fwd(const FwdParams& p) {
  const Shape& s = p.shape;
  const Layer l = layer_of(p);
  const ReferenceForward f = reference_forward(l.view(s));
  store(p.y, s.dtype, p.reverse ? reverse_steps(f.y, s.steps) : f.y);
  store(p.h_n, s.dtype, f.h_n);
  store(p.c_n, s.dtype, f.c_n);
}

void reference_bwd(const FwdParams& fwd, const BwdParams& p) {
  const Shape& s = p.shape;
  const int64_t T = s.steps, B = s.batch, H = s.hidden;
  const Layer l = layer_of(fwd);
  const ReferenceLayer view = l.view(s);
  const ReferenceForward f = reference_forward(view);
  std::vector<double> dy = to_doubles(p.dy, s.dtype, T * B * H);
  if (p.reverse) dy = reverse_steps(dy, T);
  const std::vector<double> dh_n = to_doubles(p.dh_n, s.dtype, B * H), dc_n = to_doubles(p.dc_n, s.dtype, B * H);
  const ReferenceGrads g = reference_backward(view, f, data_or_null(dy), data_or_null(dh_n), data_or_null(dc_n));
  store(p.dx, s.dtype, p.reverse ? reverse_steps(g.dx, T) : g.dx);
  store(p.dw_ih, s.dtype, g.dw_ih);
  store(p.dw_hh, s.dtype, g.dw_hh);
  store(p.db, s.dtype, g.db);
  store(p.dh0, s.dtype, g.dh0);
  store(p.dc0, s.dtype, g.dc0);
}

}  // namespace hfnn::kernels::lstm
