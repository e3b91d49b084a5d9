#include "profiles/cupti_activity.h"

#include <cupti.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <utility>

namespace hfnn::profiles {
namespace {

constexpr size_t kBufferBytes = 4 << 20;
constexpr size_t kAlign = 8;

std::mutex g_mutex;  // guards the pending vectors, filled from CUPTI's buffer callback
std::vector<GpuRecord> g_records;
std::vector<Correlation> g_correlations;
std::atomic<bool> g_active{false};
Join g_join = Join::kExternalCorrelation;
thread_local uint64_t t_current_op = 0;  // the callback join: the op running on this thread

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
        records.push_back({GpuRecord::Kind::kKernel, k->name, k->start, k->end, k->correlationId, k->deviceId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        records.push_back({GpuRecord::Kind::kMemcpy, "[memcpy]", m->start, m->end, m->correlationId, m->deviceId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        records.push_back({GpuRecord::Kind::kMemset, "[memset]", m->start, m->end, m->correlationId, m->deviceId});
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

// What the join needs: kernels, memcpy and memset with their times, and the external correlation
// records that tie each launching API call to the op that made it.
const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};
// External correlation records come only for API calls CUPTI traces (seen on H200, CUPTI 13.0:
// none at all with the kernel kinds alone). Tracing every runtime and driver API call (the RUNTIME
// and DRIVER kinds) costs CPU time in each of them, and torch makes several per op that put
// nothing on the GPU (cudaGetDevice, cudaGetLastError, stream and event queries); so only the
// calls that do are traced: those whose names hold "Launch", "Memcpy" or "Memset"
// (cudaLaunchKernel, __cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernelEx, cudaGraphLaunch,
// cudaMemcpyAsync, cuMemsetD32Async, ...), picked by name from CUPTI's own callback table, so the
// entry points of a newer CUDA are in too. Where CUPTI refuses that, or HFNN_CUPTI_API=all asks
// for it (to compare), both kinds whole, as before. The API records themselves are dropped as
// they arrive.
const CUpti_ActivityKind kApiKinds[] = {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER};
constexpr uint32_t kMaxCallbackId = 4096;  // past every CUPTI 13 table (523 runtime, 807 driver ids)

std::vector<std::pair<CUpti_CallbackDomain, uint32_t>> g_apis;  // the API calls traced one by one
bool g_all_apis = false;
bool g_paused = false;
std::string g_traced;

bool puts_work_on_the_gpu(const char* name) {
  const std::string_view n(name);
  return n.find("Launch") != std::string_view::npos || n.find("Memcpy") != std::string_view::npos ||
         n.find("Memset") != std::string_view::npos;
}

CUptiResult enable_api(CUpti_CallbackDomain domain, uint32_t cbid, uint8_t enable) {
  return domain == CUPTI_CB_DOMAIN_RUNTIME_API ? cuptiActivityEnableRuntimeApi(cbid, enable)
                                               : cuptiActivityEnableDriverApi(cbid, enable);
}

// Every kind and traced API call on (1) or off (0), the lists kept.
CUptiResult set_tracing(uint8_t on) {
  CUptiResult r = CUPTI_SUCCESS;
  for (auto kind : kKinds) {
    if (kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION && g_join != Join::kExternalCorrelation) continue;
    if (const CUptiResult k = on ? cuptiActivityEnable(kind) : cuptiActivityDisable(kind); r == CUPTI_SUCCESS) r = k;
  }
  for (const auto& [domain, cbid] : g_apis)
    if (const CUptiResult k = enable_api(domain, cbid, on); r == CUPTI_SUCCESS) r = k;
  if (g_all_apis)
    for (auto kind : kApiKinds)
      if (const CUptiResult k = on ? cuptiActivityEnable(kind) : cuptiActivityDisable(kind); r == CUPTI_SUCCESS) r = k;
  return r;
}

void untrace_apis() {
  for (const auto& [domain, cbid] : g_apis) enable_api(domain, cbid, 0);
  g_apis.clear();
  if (g_all_apis)
    for (auto kind : kApiKinds) cuptiActivityDisable(kind);
  g_all_apis = false;
}

CUptiResult trace_all_apis() {
  untrace_apis();
  g_all_apis = true;
  g_traced = "every runtime and driver API call";
  CUptiResult r = CUPTI_SUCCESS;
  for (size_t i = 0; r == CUPTI_SUCCESS && i < std::size(kApiKinds); ++i) r = cuptiActivityEnable(kApiKinds[i]);
  return r;
}

// The launch, memcpy and memset calls alone; false (nothing traced) where CUPTI refuses.
bool trace_launch_apis() {
  int runtime = 0, driver = 0;
  for (const auto domain : {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API}) {
    for (uint32_t cbid = 1; cbid < kMaxCallbackId; ++cbid) {
      const char* name = nullptr;
      if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name || !puts_work_on_the_gpu(name)) continue;
      if (enable_api(domain, cbid, 1) != CUPTI_SUCCESS) {
        untrace_apis();
        return false;
      }
      g_apis.emplace_back(domain, cbid);
      ++(domain == CUPTI_CB_DOMAIN_RUNTIME_API ? runtime : driver);
    }
  }
  if (runtime == 0) {  // no names: not a CUPTI that can say
    untrace_apis();
    return false;
  }
  g_traced = "launch, memcpy and memset calls (" + std::to_string(runtime) + " runtime and " + std::to_string(driver) +
             " driver APIs)";
  return true;
}

// ---- The callback join ----
// CUPTI's callback API on the launch calls (the same ones trace_launch_apis picks): at each call's
// entry, the id CUPTI gives the kernel it launches (the correlation id of the kernel's record) and
// the op running on this thread, which the collector sets at each op's start and end (push, pop).
// Both the runtime call and the driver call it makes are seen; the kernel's record carries one of
// their ids, and the join looks them all up. No API activity records, nothing pushed into CUPTI
// around ops: what Kineto's external correlation costs on launch-bound steps is what this saves.
CUpti_SubscriberHandle g_subscriber = nullptr;
std::vector<std::pair<CUpti_CallbackDomain, uint32_t>> g_callbacks;  // the launch calls subscribed
std::mutex g_launch_mutex;
std::vector<Correlation> g_launches;

void CUPTIAPI on_launch(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_ENTER) return;
  const uint64_t op = t_current_op;
  if (!op) return;
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  g_launches.push_back({cb->correlationId, op});
}

void enable_launch_callbacks(uint32_t on) {
  if (!g_subscriber) return;
  for (const auto& [domain, cbid] : g_callbacks) cuptiEnableCallback(on, g_subscriber, domain, cbid);
}

bool subscribe_launch_callbacks() {
  if (cuptiSubscribe(&g_subscriber, on_launch, nullptr) != CUPTI_SUCCESS) {
    g_subscriber = nullptr;
    return false;
  }
  int runtime = 0, driver = 0;
  for (const auto domain : {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API}) {
    for (uint32_t cbid = 1; cbid < kMaxCallbackId; ++cbid) {
      const char* name = nullptr;
      if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name || !puts_work_on_the_gpu(name)) continue;
      if (cuptiEnableCallback(1, g_subscriber, domain, cbid) != CUPTI_SUCCESS) continue;
      g_callbacks.emplace_back(domain, cbid);
      ++(domain == CUPTI_CB_DOMAIN_RUNTIME_API ? runtime : driver);
    }
  }
  if (runtime == 0) {
    cuptiUnsubscribe(g_subscriber);
    g_subscriber = nullptr;
    g_callbacks.clear();
    return false;
  }
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
  g_traced = "none: kernels joined by callbacks on the launch, memcpy and memset calls (" + std::to_string(runtime) +
             " runtime and " + std::to_string(driver) + " driver APIs)";
  return true;
}

void unsubscribe() {
  if (!g_subscriber) return;
  cuptiUnsubscribe(g_subscriber);
  g_subscriber = nullptr;
  g_callbacks.clear();
}

std::string describe(CUptiResult r) {
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  return text ? text : "unknown CUPTI error";
}

// ---- Detaching ----
// CUPTI allows one subscriber, so the launch callbacks' is gone first; this one sees every runtime
// and driver call, and the first to return finalizes CUPTI from inside its callback (the exit of an
// API call, as NVIDIA's cupti_finalize sample does), which also ends the subscription. cuptiFinalize
// is process-wide: a tool tracing with CUPTI's activity API alone (no subscriber) would lose its
// trace too; one holding the subscriber makes the request fail ("refused"). After it no hfnn code
// calls CUPTI (every CuptiActivity entry point checks g_active, false since stop()); a thread that
// passed that check just before (an op's push or pop on another thread) would re-initialize CUPTI
// lazily, which costs only the detach.
enum class Detach { kNone, kRequested, kFinalized, kFailed, kRefused, kCancelled };
std::atomic<Detach> g_detach{Detach::kNone};
std::atomic<bool> g_finalizing{false};  // claimed once: by the callback that finalizes, or by cancel_detach

void CUPTIAPI on_api_for_detach(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_EXIT || g_finalizing.exchange(true)) return;
  g_detach = cuptiFinalize() == CUPTI_SUCCESS ? Detach::kFinalized : Detach::kFailed;
}

void request_detach() {
  CUpti_SubscriberHandle detacher = nullptr;
  if (cuptiSubscribe(&detacher, on_api_for_detach, nullptr) != CUPTI_SUCCESS) {
    g_detach = Detach::kRefused;  // another tool holds CUPTI's subscriber
    return;
  }
  if (cuptiEnableDomain(1, detacher, CUPTI_CB_DOMAIN_RUNTIME_API) != CUPTI_SUCCESS ||
      cuptiEnableDomain(1, detacher, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS) {
    cuptiUnsubscribe(detacher);
    g_detach = Detach::kRefused;
    return;
  }
  g_detach = Detach::kRequested;
}

}  // namespace

bool CuptiActivity::start(std::string* why_not, Join join) {
  if (g_active) return true;
  g_join = join;
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  for (size_t i = 0; r == CUPTI_SUCCESS && i < std::size(kKinds); ++i) r = cuptiActivityEnable(kKinds[i]);
  if (r == CUPTI_SUCCESS) {
    const char* all = std::getenv("HFNN_CUPTI_API");
    // HFNN_CUPTI_API=all (to compare) and a CUPTI that refuses a subscriber (one is allowed, and
    // another tool may hold it): Kineto's way.
    if (join == Join::kCallbacks && ((all && std::string_view(all) == "all") || !subscribe_launch_callbacks()))
      g_join = Join::kExternalCorrelation;
    if (g_join == Join::kExternalCorrelation) {
      if ((all && std::string_view(all) == "all") || !trace_launch_apis()) r = trace_all_apis();
    }
  }
  if (r != CUPTI_SUCCESS) {
    untrace_apis();
    unsubscribe();
    for (auto kind : kKinds) cuptiActivityDisable(kind);
    if (why_not) *why_not = describe(r);
    return false;
  }
  if (g_join == Join::kNone || g_join == Join::kAttachedOnly) {
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
    if (g_join == Join::kAttachedOnly)
      for (auto kind : kKinds) cuptiActivityDisable(kind);
    g_traced = g_join == Join::kNone ? "none (HFNN_PROFILE_PARTS=kernels-only)" : "none (HFNN_PROFILE_PARTS=attached)";
  }
  g_active = true;
  return true;
}

void CuptiActivity::cancel_detach() {
  if (g_detach == Detach::kRequested && !g_finalizing.exchange(true)) g_detach = Detach::kCancelled;
}

const char* CuptiActivity::detach_state() {
  switch (g_detach.load()) {
    case Detach::kRequested: return "requested";
    case Detach::kFinalized: return "finalized";
    case Detach::kFailed: return "cuptiFinalize failed";
    case Detach::kRefused: return "refused: another tool holds CUPTI's subscriber";
    case Detach::kCancelled: return "not done: no CUDA call between the recorded steps' end and the exit";
    default: return "none";
  }
}

const char* CuptiActivity::join_name() {
  switch (g_join) {
    case Join::kCallbacks: return "callbacks";
    case Join::kNone: return "none";
    case Join::kAttachedOnly: return "none, CUPTI attached only";
    default: return "external correlation";
  }
}

void CuptiActivity::stop(bool detach) {
  if (!g_active.exchange(false)) return;
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  untrace_apis();
  unsubscribe();
  for (auto kind : kKinds) cuptiActivityDisable(kind);
  g_paused = false;
  if (detach) request_detach();
}

void CuptiActivity::pause() {
  if (!g_active || g_paused) return;
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  set_tracing(0);
  enable_launch_callbacks(0);
  g_paused = true;
}

void CuptiActivity::resume() {
  if (!g_active || !g_paused) return;
  set_tracing(1);
  enable_launch_callbacks(1);
  g_paused = false;
}

std::string CuptiActivity::traced_apis() { return g_active ? g_traced : std::string(); }

bool CuptiActivity::trace_every_api() {
  if (!g_active || g_paused || g_all_apis || g_join == Join::kNone || g_join == Join::kAttachedOnly) return false;
  if (g_join == Join::kCallbacks) {
    // The callbacks saw no launch: Kineto's way from here on (ops begun before push nothing; their
    // pops find CUPTI's stack empty, which it refuses harmlessly).
    unsubscribe();
    g_join = Join::kExternalCorrelation;
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) != CUPTI_SUCCESS) return false;
  }
  return trace_all_apis() == CUPTI_SUCCESS;
}

void CuptiActivity::push(uint64_t external) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  if (g_join == Join::kCallbacks) t_current_op = external;
  else if (g_join == Join::kExternalCorrelation)
    cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, external);
}

void CuptiActivity::pop(uint64_t parent) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  if (g_join == Join::kCallbacks) {
    t_current_op = parent;
  } else if (g_join == Join::kExternalCorrelation) {
    uint64_t ignored = 0;
    cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &ignored);
  }
}

void CuptiActivity::drain(std::vector<GpuRecord>* records, std::vector<Correlation>* correlations, bool forced) {
  if (g_active.load(std::memory_order_relaxed))
    cuptiActivityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
  std::lock_guard<std::mutex> lock(g_mutex);
  {
    std::lock_guard<std::mutex> launches(g_launch_mutex);
    g_correlations.insert(g_correlations.end(), g_launches.begin(), g_launches.end());
    g_launches.clear();
  }
  records->insert(records->end(), g_records.begin(), g_records.end());
  correlations->insert(correlations->end(), g_correlations.begin(), g_correlations.end());
  g_records.clear();
  g_correlations.clear();
}

}  // namespace hfnn::profiles
