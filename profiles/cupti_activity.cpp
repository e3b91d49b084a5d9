#include "profiles/cupti_activity.h"

#include <cupti.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace hfnn::profiles {
namespace {

constexpr size_t kBufferBytes = 4 << 20;
constexpr size_t kAlign = 8;

std::mutex g_mutex;  // guards the pending vectors, filled from CUPTI's buffer callback
std::vector<GpuRecord> g_records;
std::vector<Correlation> g_correlations;
std::atomic<bool> g_active{false};

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<GpuRecord> records;
  std::vector<Correlation> correlations;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        records.push_back({GpuRecord::Kind::kKernel, k->name, k->start, k->end, k->correlationId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        records.push_back({GpuRecord::Kind::kMemcpy, "[memcpy]", m->start, m->end, m->correlationId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        records.push_back({GpuRecord::Kind::kMemset, "[memset]", m->start, m->end, m->correlationId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
        if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
          correlations.push_back({e->correlationId, e->externalId});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records.insert(g_records.end(), records.begin(), records.end());
  g_correlations.insert(g_correlations.end(), correlations.begin(), correlations.end());
}

// External correlation records come only for API calls CUPTI traces (seen on H200, CUPTI 13.0:
// none at all with the kernel kinds alone), so the runtime and driver API kinds are on too; their
// own records are dropped as they arrive.
const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMSET,           CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
                                     CUPTI_ACTIVITY_KIND_RUNTIME,          CUPTI_ACTIVITY_KIND_DRIVER};

std::string describe(CUptiResult r) {
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  return text ? text : "unknown CUPTI error";
}

}  // namespace

bool CuptiActivity::start(std::string* why_not) {
  if (g_active) return true;
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  for (size_t i = 0; r == CUPTI_SUCCESS && i < std::size(kKinds); ++i) r = cuptiActivityEnable(kKinds[i]);
  if (r != CUPTI_SUCCESS) {
    for (auto kind : kKinds) cuptiActivityDisable(kind);
    if (why_not) *why_not = describe(r);
    return false;
  }
  g_active = true;
  return true;
}

void CuptiActivity::stop() {
  if (!g_active.exchange(false)) return;
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (auto kind : kKinds) cuptiActivityDisable(kind);
}

void CuptiActivity::push(uint64_t external) {
  if (g_active.load(std::memory_order_relaxed))
    cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, external);
}

void CuptiActivity::pop() {
  uint64_t ignored = 0;
  if (g_active.load(std::memory_order_relaxed))
    cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &ignored);
}

void CuptiActivity::drain(std::vector<GpuRecord>* records, std::vector<Correlation>* correlations, bool forced) {
  if (g_active.load(std::memory_order_relaxed))
    cuptiActivityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
  std::lock_guard<std::mutex> lock(g_mutex);
  records->insert(records->end(), g_records.begin(), g_records.end());
  correlations->insert(correlations->end(), g_correlations.begin(), g_correlations.end());
  g_records.clear();
  g_correlations.clear();
}

}  // namespace hfnn::profiles
