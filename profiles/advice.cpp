#include "profiles/advice.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <utility>

#include "profiles/plain_step.h"

namespace hfnn::profiles {
namespace {

// Order in the report: what bounds the whole step first, then what costs GPU or CPU time in it.
constexpr int kSeverityStep = 3;    // the step itself is bound by something other than the GPU's work
constexpr int kSeveritySync = 2;    // stalls or extra GPU work inside every step
constexpr int kSeverityTuning = 1;  // a setting that costs time, smaller in the usual case

// The GPU idles over 15% of the step: the same line as hfnn tune's CPU-bound note
// (report.cpp's cpu_bound_note), so the report and the tune section agree on what CPU-bound is.
constexpr double kCpuBoundBusyShare = 0.85;
// Kernel launches (and memcpys, memsets) per ms of step at which launching is what keeps the GPU
// waiting: eager PyTorch spends roughly 10-20 µs of CPU per op it launches (Python, the
// dispatcher, the launch), so at 20 a ms launching alone fills 20-40% of the CPU's step.
constexpr double kHighLaunchRatePerMs = 20;
// Dtype and device copies (aten::_to_copy, autocast's casts among them) above 10% of the ops' GPU
// time: a bf16 autocast step that keeps its weights in bf16 spends a few % there; issue 13's
// transformer profiles spent 15% casting fp32 weights every step.
constexpr double kCastShare = 0.10;
// Per-parameter update ops a step at which a for-loop optimizer is worth replacing: AdamW's loop
// runs about 8 per parameter, so 16 is two parameters; below that there is little to batch.
constexpr double kManyPerParameterOpsPerStep = 16;

// The in-place ops torch.optim's for-loop implementations run per parameter and update term
// (Adam, AdamW, SGD with momentum, RMSprop, Adagrad); foreach runs aten::_foreach_* instead,
// fused one aten::_fused_* kernel.
constexpr const char* kPerParameterOps[] = {"aten::add_",  "aten::mul_", "aten::addcdiv_", "aten::addcmul_",
                                            "aten::lerp_", "aten::div_", "aten::sqrt",     "aten::maximum"};

// Ops that read a CUDA tensor's value on the host, so the CPU waits for the GPU to drain its queue,
// with what in a script runs them (torch records .item() as aten::item around this op).
constexpr std::pair<const char*, const char*> kSyncOps[] = {
    {"aten::_local_scalar_dense", ".item(), .tolist(), float(t), int(t), `if t:`"},
    {"aten::nonzero", "nonzero(), one-argument torch.where, boolean-mask indexing"},
};

double ms(double us) { return us / 1e3; }

bool starts_with(std::string_view s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

// How to read a saving of the GPU's idle time, by the step it is of.
std::string idle_saving_note(const RunFacts& f) {
  return f.plain_step_ms ? "upper bound: the GPU's idle time in the plain step (timed with the profiler off); the step "
                           "gets no shorter than the GPU's busy time"
                         : "upper bound: the GPU's idle time in a step measured under the profiler, which itself "
                           "stretches CPU-bound steps (no plain step); the step gets no shorter than the GPU's busy time";
}

// 1. The GPU idles for much of the step while the CPU launches many small kernels. The share and
// the launch rate are of the plain step where the run has one: under the profiler a CPU-bound step
// is longer, which makes the GPU look idler and the launches sparser than they are.
std::optional<Advice> cpu_bound_launches(const RunFacts& f) {
  const double step = f.basis_step_ms();
  if (!f.gpu_busy_ms || step <= 0 || f.rank_steps == 0) return std::nullopt;
  const double busy = *f.gpu_busy_ms, share = busy / step;
  const double launches = f.per_step(static_cast<double>(f.gpu_activities)), rate = launches / step;
  if (share >= kCpuBoundBusyShare || rate < kHighLaunchRatePerMs) return std::nullopt;
  Advice a;
  a.severity = kSeverityStep;
  a.title = fmt::format("The step is CPU-bound: the GPU is busy {:.0f}% of it, waiting on kernel launches", 100 * share);
  a.action = "Launch fewer, larger kernels: capture the step in a CUDA graph (torch.compile(mode=\"reduce-overhead\") "
             "or torch.cuda.graphs), fuse its small ops with torch.compile, or raise the batch size so each launch "
             "does more work";
  a.evidence = fmt::format("GPU busy {:.2f} ms of {}; {:.0f} kernel launches a step ({:.1f} a ms of "
                           "step, {:.1f} µs of GPU time each on average)",
                           busy, f.step_text(), launches, rate, launches > 0 ? 1e3 * busy / launches : 0.0);
  a.saving_ms = step - busy;
  a.saving_note = idle_saving_note(f);
  return a;
}

// 1b. The GPU idles but launches are few: the CPU is busy with something else (data, Python).
std::optional<Advice> gpu_idle_host_work(const RunFacts& f) {
  const double step = f.basis_step_ms();
  if (!f.gpu_busy_ms || step <= 0 || f.rank_steps == 0) return std::nullopt;
  const double busy = *f.gpu_busy_ms, share = busy / step;
  const double launches = f.per_step(static_cast<double>(f.gpu_activities)), rate = launches / step;
  if (share >= kCpuBoundBusyShare || rate >= kHighLaunchRatePerMs) return std::nullopt;
  Advice a;
  a.severity = kSeverityStep;
  a.title = fmt::format("The GPU is idle {:.0f}% of the step, and not for want of launches", 100 * (1 - share));
  a.action = "Find the host work between launches: data loading (DataLoader num_workers, pin_memory=True with "
             "non_blocking=True copies), Python-side preprocessing or logging in the loop, and the ops with the "
             "most CPU self time above";
  a.evidence = fmt::format("GPU busy {:.2f} ms of {}; only {:.0f} kernel launches a step ({:.1f} a ms "
                           "of step)",
                           busy, f.step_text(), launches, rate);
  a.saving_ms = step - busy;
  a.saving_note = idle_saving_note(f);
  return a;
}

// 2. Host-device synchronisations inside the step.
std::optional<Advice> host_device_sync(const RunFacts& f) {
  if (!f.has_cuda || f.rank_steps == 0) return std::nullopt;
  std::string found;
  double calls = 0, wait_us = 0;
  for (const auto& [name, how] : kSyncOps) {
    const OpTotals o = f.op(name);
    // CUDA time on the op: it copied from the GPU (a read of a CPU tensor has none and does not sync).
    if (o.calls == 0 || o.cuda_total_us <= 0) continue;
    calls += f.per_step(static_cast<double>(o.calls));
    wait_us += f.per_step(o.cpu_total_us);
    found += fmt::format("{}{} {:.1f} a step ({})", found.empty() ? "" : "; ", name,
                         f.per_step(static_cast<double>(o.calls)), how);
  }
  if (calls <= 0) return std::nullopt;
  Advice a;
  a.severity = kSeveritySync;
  a.title = fmt::format("The step waits for the GPU {:.1f} times: values read back to the host inside the loop", calls);
  a.action = "Keep values on the GPU inside the loop: accumulate the loss as a tensor and call .item() every N steps "
             "or after the loop, avoid Python conditions on tensors, .tolist(), .cpu() and printing tensors in the "
             "step, and give data-dependent shapes (nonzero, boolean masks) a fixed-size form such as torch.where(c, a, b)";
  a.evidence = fmt::format("{}; {:.2f} ms of CPU a step in them, most of it waiting for the GPU (calls on CPU "
                           "tensors, such as an optimizer's step counter, are counted too and do not wait)",
                           found, ms(wait_us));
  a.saving_note = "not estimated: a sync costs the GPU's queue (it idles while the CPU catches up), which the "
                  "profile does not measure";
  return a;
}

// 3. Autocast cast traffic: fp32 weights cast to the compute dtype every step.
std::optional<Advice> autocast_casts(const RunFacts& f) {
  if (!f.has_cuda || f.rank_steps == 0 || f.cuda_self_total_us <= 0) return std::nullopt;
  // aten::_to_copy's total covers its aten::copy_ kernels once (aten::to around it would count them again).
  const OpTotals casts = f.op("aten::_to_copy");
  const double share = casts.cuda_total_us / f.cuda_self_total_us;
  if (share < kCastShare) return std::nullopt;
  Advice a;
  a.severity = kSeveritySync;
  a.title = fmt::format("Dtype casts take {:.0f}% of the GPU time: autocast casting fp32 weights every step", 100 * share);
  a.action = "Keep weights in the compute dtype: bf16 parameters with fp32 master weights kept by the optimizer, "
             "or FSDP's MixedPrecision(param_dtype=torch.bfloat16); cast the input batch once, in the data loader";
  a.evidence = fmt::format("aten::_to_copy (dtype and device copies) {:.2f} ms of GPU time a step in {:.0f} calls, "
                           "{:.1f}% of the {:.2f} ms the ops account for; aten::copy_ {:.1f}% (self)",
                           ms(f.per_step(casts.cuda_total_us)), f.per_step(static_cast<double>(casts.calls)),
                           100 * share, ms(f.per_step(f.cuda_self_total_us)),
                           100 * f.op("aten::copy_").cuda_self_us / f.cuda_self_total_us);
  a.saving_ms = ms(f.per_step(casts.cuda_total_us));
  a.saving_note = "upper bound: the copies' GPU time; it shortens the step where the GPU bounds it, and the "
                  "input's copies remain";
  return a;
}

// 4. An optimizer that runs one op per parameter and update term (neither foreach nor fused).
std::optional<Advice> optimizer_foreach(const RunFacts& f) {
  if (f.rank_steps == 0) return std::nullopt;
  std::string optimizer;
  double optimizer_cpu_us = 0;
  for (const auto& [name, o] : f.ops) {
    if (starts_with(name, "aten::_foreach_") || starts_with(name, "aten::_fused_")) return std::nullopt;
    // torch.optim names its step "Optimizer.step#AdamW.step".
    constexpr std::string_view kStep = "Optimizer.step#";
    if (starts_with(name, kStep)) {
      const std::string cls = name.substr(kStep.size(), name.find('.', kStep.size()) - kStep.size());
      optimizer += (optimizer.empty() ? "" : ", ") + cls;
      optimizer_cpu_us += o.cpu_total_us;
    }
  }
  if (optimizer.empty()) return std::nullopt;  // without torch.optim's scope an add_ may be the model's
  double per_parameter = 0;
  std::string counts;
  for (const char* name : kPerParameterOps) {
    const double n = f.per_step(static_cast<double>(f.op(name).calls));
    if (n <= 0) continue;
    per_parameter += n;
    counts += fmt::format("{}{} {:.0f}", counts.empty() ? "" : ", ", name, n);
  }
  if (per_parameter < kManyPerParameterOpsPerStep) return std::nullopt;
  Advice a;
  a.severity = kSeverityTuning;
  a.title = fmt::format("The optimizer ({}) updates one parameter at a time: {:.0f} ops a step", optimizer, per_parameter);
  a.action = fmt::format("Pass fused=True (one kernel for the whole update: Adam, AdamW, SGD, Adagrad) or foreach=True "
                         "(one op per update term for all parameters) to torch.optim.{}; torch picks foreach by default "
                         "only when every parameter is on CUDA",
                         optimizer.substr(0, optimizer.find(',')));
  a.evidence = fmt::format("{} a step and no aten::_foreach_* or aten::_fused_* op; the optimizer step took {:.2f} ms "
                           "of CPU a step",
                           counts, ms(f.per_step(optimizer_cpu_us)));
  a.saving_ms = ms(f.per_step(optimizer_cpu_us));
  a.saving_note = "upper bound: the optimizer step's CPU time under the profiler; a fused step still takes some, and "
                  "it shortens the step where the CPU bounds it";
  return a;
}

using Rule = std::optional<Advice> (*)(const RunFacts&);
// Every rule, by its stable id. A new rule: a function above and a line here.
constexpr std::pair<const char*, Rule> kRules[] = {
    {"cpu_bound_launches", cpu_bound_launches}, {"gpu_idle_host_work", gpu_idle_host_work},
    {"host_device_sync", host_device_sync},     {"autocast_casts", autocast_casts},
    {"optimizer_foreach", optimizer_foreach},
};

}  // namespace

std::string RunFacts::step_text() const {
  if (plain_step_ms)
    return fmt::format("a {:.2f} ms step without the profiler ({:.2f} ms under it)", *plain_step_ms, profiled_step_ms);
  return fmt::format("a {:.2f} ms step under the profiler (no plain step)", step_ms);
}

OpTotals RunFacts::op(const std::string& name) const {
  const auto it = ops.find(name);
  return it == ops.end() ? OpTotals{} : it->second;
}

RunFacts read_run_facts(Database& db, int64_t run_id) {
  RunFacts f;
  Statement steps(db.handle(), "SELECT count(*), coalesce(avg(wall_ms), 0), avg(gpu_busy_ms) FROM step_stats WHERE run_id = ?");
  steps.bind(1, run_id);
  steps.step();
  f.rank_steps = steps.column_int(0);
  f.step_ms = steps.column_double(1);
  if (!steps.column_is_null(2)) f.gpu_busy_ms = steps.column_double(2);
  const PlainStep plain = read_plain_step(db, run_id);
  f.plain_step_ms = plain.plain_ms;
  f.profiled_step_ms = plain.profiled_ms;
  Statement kernels(db.handle(), "SELECT coalesce(sum(calls), 0) FROM kernel_stats WHERE run_id = ?");
  kernels.bind(1, run_id);
  kernels.step();
  f.gpu_activities = kernels.column_int(0);
  Statement ops(db.handle(),
                "SELECT name, sum(calls), sum(cpu_self_us), sum(cpu_total_us), coalesce(sum(cuda_self_us), 0),"
                " coalesce(sum(cuda_total_us), 0) FROM op_stats WHERE run_id = ? GROUP BY name");
  ops.bind(1, run_id);
  while (ops.step()) {
    OpTotals& o = f.ops[ops.column_text(0)];
    o.calls = ops.column_int(1);
    o.cpu_self_us = ops.column_double(2);
    o.cpu_total_us = ops.column_double(3);
    o.cuda_self_us = ops.column_double(4);
    o.cuda_total_us = ops.column_double(5);
    f.cuda_self_total_us += o.cuda_self_us;
  }
  f.has_cuda = f.cuda_self_total_us > 0;
  return f;
}

std::vector<Advice> advise(const RunFacts& facts) {
  std::vector<Advice> out;
  for (const auto& [id, rule] : kRules)
    if (auto a = rule(facts)) {
      a->id = id;
      out.push_back(std::move(*a));
    }
  std::stable_sort(out.begin(), out.end(), [](const Advice& a, const Advice& b) {
    if (a.severity != b.severity) return a.severity > b.severity;
    return a.saving_ms.value_or(0) > b.saving_ms.value_or(0);
  });
  return out;
}

std::vector<std::string> advice_rule_ids() {
  std::vector<std::string> ids;
  for (const auto& [id, rule] : kRules) ids.emplace_back(id);
  return ids;
}

nlohmann::json advice_json(const std::vector<Advice>& advice) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& a : advice)
    out.push_back({{"id", a.id}, {"title", a.title}, {"action", a.action}, {"evidence", a.evidence},
                   {"saving_ms", a.saving_ms ? nlohmann::json(*a.saving_ms) : nlohmann::json()},
                   {"saving_note", a.saving_note}, {"severity", a.severity}});
  return out;
}

}  // namespace hfnn::profiles
