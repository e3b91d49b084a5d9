#include "profiles/step_times.h"

#include <algorithm>

namespace hfnn::profiles {

std::optional<size_t> GpuStepTimes::record_next() {
  // The slot about to be written holds an older event: a step still waiting on it is settled first
  // (the host is a ring's worth of events ahead of the GPU; it waits for it, as the launch queue
  // would make it do soon anyway). Where waiting is not allowed, that step keeps its host time.
  while (!pending_.empty() && recorded_ - pending_.front().second >= slots_)
    if (!settle_front(true)) pending_.pop_front();
  if (start_ && recorded_ - *start_ >= slots_) start_.reset();
  const size_t slot = static_cast<size_t>(recorded_ % slots_);
  if (!clock_->record(slot)) return std::nullopt;
  ++recorded_;
  return slot;
}

void GpuStepTimes::mark() {
  if (!clock_) return;
  const auto slot = record_next();
  start_ = slot ? std::optional<uint64_t>(recorded_ - 1) : std::nullopt;
}

void GpuStepTimes::end_step(std::vector<double>* times, size_t index) {
  if (!clock_) return;
  const std::optional<uint64_t> start = start_;
  start_.reset();
  if (!start) return;  // its start was not marked: the host time stands
  const auto end = record_next();
  if (!end || recorded_ - *start > slots_) return;  // its start event was overwritten meanwhile
  pending_.push_back({{times, index, static_cast<size_t>(*start % slots_), *end}, *start});
}

bool GpuStepTimes::settle_front(bool wait) {
  const Step& step = pending_.front().first;
  if (!clock_->completed(step.end, wait)) return false;
  if (const auto gpu = clock_->elapsed_ms(step.start, step.end); gpu && step.index < step.times->size()) {
    double& time = (*step.times)[step.index];
    time = std::max(time, *gpu);
  }
  pending_.pop_front();
  return true;
}

void GpuStepTimes::settle(bool wait) {
  // Events complete in the order the stream reaches them: the oldest first.
  while (!pending_.empty())
    if (!settle_front(wait)) {
      if (wait) pending_.pop_front();  // cannot wait now (a capture): that step keeps its host time
      else break;
    }
}

}  // namespace hfnn::profiles
