// The float64 CPU reference for one LSTM layer in one direction: what every LSTM variant and the
// tuner's gate are checked against. Torch-free and slow on purpose: plain loops over time, batch
// and gates, in torch's formulation (nn.LSTM):
//
//   gates = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh         [B, 4H], in the order i, f, g, o
//   i = sigmoid, f = sigmoid, g = tanh, o = sigmoid (of their quarter of gates)
//   c_t = f * c_{t-1} + i * g,   h_t = o * tanh(c_t),   y_t = h_t
//
// Several layers and the reverse direction are this layer composed: a reverse direction is the same
// recurrence over the steps in reverse order (the caller reverses x and y), a layer's input is the
// previous layer's output (both directions' concatenated).
#pragma once
#include <cstdint>
#include <vector>

namespace hfnn::kernels::lstm {

// Time-major, contiguous, row-major arrays of doubles.
struct ReferenceLayer {
  int64_t steps = 0, batch = 0, input = 0, hidden = 0;
  const double* x = nullptr;     // [steps, batch, input]
  const double* w_ih = nullptr;  // [4 hidden, input]
  const double* w_hh = nullptr;  // [4 hidden, hidden]
  const double* b_ih = nullptr;  // [4 hidden], or null (bias=False)
  const double* b_hh = nullptr;  // [4 hidden], or null
  const double* h0 = nullptr;    // [batch, hidden], or null: zeros
  const double* c0 = nullptr;    // [batch, hidden], or null: zeros
};

// The forward's outputs, and what the backward reads again.
struct ReferenceForward {
  std::vector<double> y;      // [steps, batch, hidden]: h_t
  std::vector<double> h_n;    // [batch, hidden]
  std::vector<double> c_n;    // [batch, hidden]
  std::vector<double> gates;  // [steps, batch, 4 hidden]: i, f, g, o after their activations
  std::vector<double> c;      // [steps, batch, hidden]: c_t
};

// Gradients of a loss L with respect to every input, given dL/dy, dL/dh_n and dL/dc_n (each may be
// null: zero). dh0/dc0 are filled whatever the layer's h0/c0 (the gradient at the zeros).
struct ReferenceGrads {
  std::vector<double> dx;     // [steps, batch, input]
  std::vector<double> dw_ih;  // [4 hidden, input]
  std::vector<double> dw_hh;  // [4 hidden, hidden]
  std::vector<double> db;     // [4 hidden]: db_ih and db_hh alike (both add to the gates)
  std::vector<double> dh0;    // [batch, hidden]
  std::vector<double> dc0;    // [batch, hidden]
};

ReferenceForward reference_forward(const ReferenceLayer& layer);
ReferenceGrads reference_backward(const ReferenceLayer& layer, const ReferenceForward& fwd, const double* dy,
                                  const double* dh_n, const double* dc_n);

}  // namespace hfnn::kernels::lstm
