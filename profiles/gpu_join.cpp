#include "profiles/gpu_join.h"

#include <algorithm>
#include <cstring>

namespace hfnn::profiles {

void GpuJoin::reset(uint64_t first_id) {
  calls_.clear();
  base_ = first_id;
  correlation_.clear();
  kernels_.clear();
  kernel_by_name_ptr_.clear();
}

void GpuJoin::forget_before(uint64_t first_id) {
  while (base_ < first_id && !calls_.empty()) {
    calls_.pop_front();
    ++base_;
  }
  if (calls_.empty()) base_ = std::max(base_, first_id);
  std::erase_if(correlation_, [first_id](const auto& c) { return c.second < first_id; });
}

void GpuJoin::add_call(const Call& call) {
  if (call.id < base_) return;  // from before a reset, or already forgotten
  const uint64_t at = call.id - base_;
  if (at >= calls_.size()) calls_.resize(at + 1);
  calls_[at] = call;
}

const GpuJoin::Call* GpuJoin::find(uint64_t id) const {
  if (id < base_ || id - base_ >= calls_.size()) return nullptr;
  const Call& call = calls_[id - base_];
  return call.id == id ? &call : nullptr;
}

size_t GpuJoin::calls_kept() const {
  return static_cast<size_t>(std::count_if(calls_.begin(), calls_.end(), [](const Call& c) { return c.id != 0; }));
}

void GpuJoin::add(const std::vector<GpuRecord>& records, const std::vector<Correlation>& correlations,
                  std::vector<std::vector<std::pair<int64_t, int64_t>>>* step_intervals) {
  this->records += static_cast<int64_t>(records.size());
  this->correlations += static_cast<int64_t>(correlations.size());
  // CUPTI writes an API's record when the call returns: across threads, slightly out of order.
  const size_t sorted = correlation_.size();
  for (const auto& c : correlations) correlation_.emplace_back(c.correlation, c.external);
  if (!std::is_sorted(correlation_.begin() + static_cast<std::ptrdiff_t>(sorted), correlation_.end())) {
    std::sort(correlation_.begin() + static_cast<std::ptrdiff_t>(sorted), correlation_.end());
  }
  std::inplace_merge(correlation_.begin(), correlation_.begin() + static_cast<std::ptrdiff_t>(sorted), correlation_.end());
  for (const auto& r : records) {
    if (std::find(devices_.begin(), devices_.end(), r.device) == devices_.end()) devices_.push_back(r.device);
    const auto corr = std::lower_bound(correlation_.begin(), correlation_.end(), std::make_pair(r.correlation, uint64_t{0}));
    if (corr == correlation_.end() || corr->first != r.correlation) {  // launched outside any recorded op
      ++no_correlation;
      continue;
    }
    const Call* call = find(corr->second);
    if (!call) {  // a warm-up step's, or one already forgotten
      ++no_op;
      continue;
    }
    ++attributed;
    const int64_t ns = static_cast<int64_t>(r.end_ns - r.start_ns);
    Kernel* kernel = nullptr;
    if (const auto it = kernel_by_name_ptr_.find(r.name);
        it != kernel_by_name_ptr_.end() && std::strcmp(it->second.first->c_str(), r.name) == 0) {
      kernel = it->second.second;
    } else {
      auto node = kernels_.try_emplace(r.name).first;
      kernel = &node->second;
      kernel_by_name_ptr_[r.name] = {&node->first, kernel};
    }
    ++kernel->calls;
    kernel->ns += ns;
    if (call->op) call->op->self_ns += ns;
    if (step_intervals && call->step >= 0 && call->step < static_cast<int>(step_intervals->size()))
      (*step_intervals)[call->step].emplace_back(static_cast<int64_t>(r.start_ns), static_cast<int64_t>(r.end_ns));
    // An op nested in itself counts once; so does a shape row, and every one around the kernel gets
    // it (a GEMM's kernel inside an attention call counts for the GEMM and the attention key).
    seen_.clear();
    auto add_total = [&](CudaTime* to) {
      if (to && std::find(seen_.begin(), seen_.end(), to) == seen_.end()) {
        seen_.push_back(to);
        to->total_ns += ns;
      }
    };
    for (const Call* it = call; it; it = it->parent ? find(it->parent) : nullptr) {
      add_total(it->op);
      add_total(it->shape);
    }
  }
}

}  // namespace hfnn::profiles
