// The in-process side of `hfnn profile`: a RecordFunction observer that aggregates, in memory,
// per-op CPU time (self and total, forward and backward), the input shapes of the ops hfnn
// accelerates, and step times, and writes them as one JSON part per process. The CLI merges the
// parts into the SQLite database (profiles/db.h). Nothing per event reaches the disk: a part's
// size depends on the number of distinct ops and shapes, not on the number of steps.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

namespace hfnn::profiles {

// config_json: {"dir": part folder, "warmup": steps skipped, "steps": steps recorded (0: all),
//               "sample": of those, every sample-th recorded in full, the others only timed (1: all),
//               "plain_steps": steps timed after them with every collection off (the plain step),
//               "meta": {...} copied into the part (versions, GPU, rank, command)}.
void start(const std::string& config_json);
// A step boundary, for loops without a torch optimizer (optimizer.step() is detected by itself).
void step();
// Whether the recorded steps are under way (warm-up included, and under --sample the unsampled
// steps between recorded ones); false once they are done.
bool recording();
// Writes the final part and stops observing. Safe to call twice.
void stop();
// The part as it would be written now, every CUDA record so far attributed (tests, debugging;
// synchronise the device first).
std::string snapshot();
// hfnn's own LayerNorm ops (hfnn::layer_norm, hfnn::layer_norm_bwd) name their shape here, first
// thing in their kernels: the collector asks torch for no op's inputs outside a few records
// (collector.cpp, boxes_inputs), and theirs are called from Python, inside none. Does nothing
// unless the innermost record of this thread is that op's, while recording.
void note_layer_norm(const at::Tensor& input, c10::IntArrayRef normalized_shape, bool affine, bool backward);

}  // namespace hfnn::profiles
