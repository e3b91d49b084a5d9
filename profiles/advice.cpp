#include "profiles/advice.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>
#include <utility>

#include "kernels/common/family.h"
#include "profiles/kernel_names.h"
#include "profiles/plain_step.h"
#include "profiles/report.h"

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
// with what in a script runs them (torch records .item() as aten::item around this op). .cpu() and
// .tolist() copy through aten::copy_ instead: the collector records those copies (kHostCopyShapeOp).
constexpr std::pair<const char*, const char*> kSyncOps[] = {
    {"aten::_local_scalar_dense", ".item(), float(t), int(t), `if t:`"},
    {"aten::nonzero", "nonzero(), one-argument torch.where, boolean-mask indexing"},
};
// The waits the start-up hook labels while recording (python/hfnn/_startup.py, _record_syncs): no
// torch op runs in them, so without a label the profile would not see them.
constexpr const char* kSyncScopes[] = {"torch.cuda.synchronize", "torch.cuda.Stream.synchronize",
                                       "torch.cuda.Event.synchronize"};

// TF32 tensor cores came with compute capability 8.0 (Ampere: A100, RTX 30xx; Hopper, Blackwell).
constexpr double kTf32Capability = 8.0;
// float32 GEMMs without TF32 above 10% of the ops' GPU time: TF32 runs them several times faster
// (hfnn's Evoformer example in float32 took 67.77 ms a step on an H200 and 47.11 ms with TF32
// matmuls, README), so there it shortens the step visibly; below 10% even a GEMM made free would not.
constexpr double kFp32GemmShare = 0.10;
// GEMMs with a dimension off the tensor-core multiple above 5% of the ops' GPU time: cuBLAS runs
// them on kernels with narrower loads or pads them itself; below 5% padding cannot save much of the
// step even where it makes those GEMMs twice as fast.
constexpr double kOffMultipleGemmShare = 0.05;
// SDPA (fused attention kernels, or the math composite) above 10% of the ops' GPU time: enough for
// the choice of core (often 1.2-2x apart on one shape) to show in the step.
constexpr double kAttentionShare = 0.10;
// The keys `hfnn tune` would time above 5% of the step together: below that, even at zero cost
// they could shorten the step by under 5% (hfnn tune's ceiling), not worth a tuning run.
constexpr double kTunableSharePct = 5;
// hfnn tune's projected saving worth a line from 1% of the step: its winners beat torch by more
// than the measured noise (at least 3%) per key, but a step a few keys barely touch gains nothing
// anyone would see.
constexpr double kTunedGainShare = 0.01;

double ms(double us) { return us / 1e3; }

bool starts_with(std::string_view s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

// A recorded shape's flag ("non_blocking", "tf32"), "" where absent.
std::string flag(const ShapeTotals& s, std::string_view name) {
  const auto settings = families::parse_settings(s.flags);
  if (!settings) return {};
  const auto it = settings->find(name);
  return it == settings->end() ? std::string() : it->second;
}

// A recorded GEMM (kGemmShapeOp): its M, N, K and what ran it.
struct Gemm {
  int64_t m = 0, n = 0, k = 0;
  std::string op;  // "addmm"
  const ShapeTotals* row = nullptr;
  std::string text() const { return fmt::format("[M={},N={},K={}] {} {}", m, n, k, row->dtype, op); }
};

std::vector<Gemm> gemms(const RunFacts& f) {
  std::vector<Gemm> out;
  for (const auto& s : f.shapes) {
    if (s.op != kGemmShapeOp) continue;
    const auto dims = families::parse_dims(s.shape);
    if (!dims || dims->size() != 3) continue;
    out.push_back({(*dims)[0], (*dims)[1], (*dims)[2], flag(s, "op"), &s});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Gemm& a, const Gemm& b) { return a.row->cuda_total_us > b.row->cuda_total_us; });
  return out;
}

// The multiple a GEMM's dimensions take for tensor cores at full speed on this GPU: each operand's
// rows 16-byte aligned, 8 elements in 16-bit and 4 in TF32 (NVIDIA's "Matrix Multiplication
// Background" guide); 0 where its dtype runs on no tensor core here (float32 without TF32 among them).
int tensor_core_multiple(const Gemm& g, double capability, bool tf32) {
  const std::string& dtype = g.row->dtype;
  if (dtype == "float16") return capability >= 7.0 ? 8 : 0;
  if (dtype == "bfloat16") return capability >= 8.0 ? 8 : 0;
  if (dtype == "float32" && tf32) return capability >= kTf32Capability ? 4 : 0;
  return 0;
}

// "LayerNorm 32768 x 256 float32 12.3%; ..." for the first `n` keys, and how many more there are.
std::string keys_text(const std::vector<const TuneKey*>& keys, const char* basis, size_t n = 5) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < n; ++i)
    out += fmt::format("{}{} {} {:.1f}%", i ? "; " : "", keys[i]->label, keys[i]->dtype, keys[i]->share_pct);
  if (keys.size() > n) out += fmt::format("; and {} more", keys.size() - n);
  return out + fmt::format(" (of {})", basis);
}

// The step hfnn tune's shares are of, in words.
const char* basis_words(const TuneFacts& t) {
  return t.basis == "plain" ? "the plain step" : t.basis == "gpu_busy" ? "the GPU busy time of a step"
                                                                       : "a step's wall time under the profiler";
}

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

// 2. Host-device synchronisations inside the step: reads of a CUDA tensor's value, copies from
// the GPU into host memory, and explicit synchronize() calls.
std::optional<Advice> host_device_sync(const RunFacts& f) {
  if (!f.has_cuda || f.rank_steps == 0) return std::nullopt;
  std::string found;
  double calls = 0, wait_us = 0;
  // One kind of sync: "what 2.0 a step (how)".
  const auto add = [&](int64_t total_calls, double cpu_us, std::string_view what, std::string_view how) {
    const double n = f.per_step(static_cast<double>(total_calls));
    calls += n;
    wait_us += f.per_step(cpu_us);
    found += fmt::format("{}{} {:.1f} a step{}", found.empty() ? "" : "; ", what, n,
                         how.empty() ? std::string() : fmt::format(" ({})", how));
  };
  for (const auto& [name, how] : kSyncOps) {
    const OpTotals o = f.op(name);
    // CUDA time on the op: it copied from the GPU (a read of a CPU tensor has none and does not sync).
    if (o.calls > 0 && o.cuda_total_us > 0) add(o.calls, o.cpu_total_us, name, how);
  }
  // A copy into host memory waits for the GPU unless non_blocking (into pinned memory).
  int64_t copies = 0;
  double copy_us = 0;
  for (const auto& s : f.shapes)
    if (s.op == kHostCopyShapeOp && flag(s, "non_blocking") != "1") {
      copies += s.calls;
      copy_us += s.cpu_total_us;
    }
  if (copies > 0) add(copies, copy_us, "aten::copy_ from the GPU to the host", ".cpu(), .tolist(), printing a tensor");
  for (const char* name : kSyncScopes)
    if (const OpTotals o = f.op(name); o.calls > 0) add(o.calls, o.cpu_total_us, fmt::format("{}()", name), "");
  if (calls <= 0) return std::nullopt;
  Advice a;
  a.severity = kSeveritySync;
  a.title = fmt::format("The step waits for the GPU {:.1f} times: values read back to the host inside the loop", calls);
  a.action = "Keep values on the GPU inside the loop: accumulate the loss as a tensor and call .item() every N steps "
             "or after the loop, avoid Python conditions on tensors, .tolist(), .cpu() and printing tensors in the "
             "step (or copy with .to(\"cpu\", non_blocking=True) and read the copy a step later), give "
             "data-dependent shapes (nonzero, boolean masks) a fixed-size form such as torch.where(c, a, b), and drop "
             "torch.cuda.synchronize() from the step (a stream runs its work in order; time with CUDA events)";
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
  // Its CPU time under the profiler, which pays the observer for each of its many ops: scaled to
  // the plain step where the run has one, as the other rules take the plain step.
  const double under = ms(f.per_step(optimizer_cpu_us));
  const std::optional<double> share = f.plain_share();
  a.evidence = fmt::format("{} a step and no aten::_foreach_* or aten::_fused_* op; the optimizer step took {:.2f} ms "
                           "of CPU a step under the profiler{}",
                           counts, under,
                           share ? fmt::format(", about {:.2f} ms without it (the plain step is {:.0f}% of the step "
                                               "under the profiler)",
                                               under * *share, 100 * *share)
                                 : std::string(" (no plain step)"));
  a.saving_ms = share ? under * *share : under;
  a.saving_note = share ? fmt::format("upper bound: the optimizer step's CPU time under the profiler scaled to the plain "
                                      "step (x{:.2f}); a fused step still takes some, and it shortens the step where "
                                      "the CPU bounds it",
                                      *share)
                        : "upper bound: the optimizer step's CPU time under the profiler, which stretches it (no plain "
                          "step to scale it to); a fused step still takes some, and it shortens the step where the CPU "
                          "bounds it";
  return a;
}

// 5. float32 matmuls without TF32 on a GPU whose tensor cores run it.
std::optional<Advice> tf32_matmuls(const RunFacts& f) {
  if (!f.has_cuda || f.rank_steps == 0 || f.cuda_self_total_us <= 0 || f.compute_capability < kTf32Capability)
    return std::nullopt;
  double us = 0;
  int64_t calls = 0;
  const Gemm* largest = nullptr;
  const auto all = gemms(f);
  for (const auto& g : all) {
    // tf32=0: the collector saw TF32 disallowed when the call ran (shapes from before it recorded
    // that say nothing, and are left alone).
    if (g.row->dtype != "float32" || flag(*g.row, "tf32") != "0" || g.row->cuda_total_us <= 0) continue;
    us += g.row->cuda_total_us;
    calls += g.row->calls;
    if (!largest) largest = &g;
  }
  const double share = us / f.cuda_self_total_us;
  if (share < kFp32GemmShare || !largest) return std::nullopt;
  Advice a;
  a.severity = kSeveritySync;
  a.title = fmt::format("float32 matmuls take {:.0f}% of the GPU time without TF32, on a GPU whose tensor cores run it",
                        100 * share);
  a.action = "Allow TF32 for float32 matmuls at the start of the script: torch.backends.cuda.matmul.fp32_precision = "
             "\"tf32\" (torch 2.9 and later; before, torch.set_float32_matmul_precision(\"high\")): inputs rounded to "
             "10 mantissa bits, sums in float32, which training usually tolerates (compare a few hundred steps' "
             "loss); or train under bf16 autocast";
  a.evidence = fmt::format("{:.0f} float32 GEMM calls a step ran with TF32 off: {:.2f} ms of GPU time a step, {:.1f}% "
                           "of the {:.2f} ms the ops account for (the largest: {}, {:.2f} ms a step); the {} (sm {:.1f}) "
                           "runs TF32 on its tensor cores",
                           f.per_step(static_cast<double>(calls)), ms(f.per_step(us)), 100 * share,
                           ms(f.per_step(f.cuda_self_total_us)), largest->text(),
                           ms(f.per_step(largest->row->cuda_total_us)), f.gpu.empty() ? "GPU" : f.gpu,
                           f.compute_capability);
  a.saving_ms = ms(f.per_step(us));
  a.saving_note = "upper bound: the float32 GEMMs' GPU time; in TF32 they still take some (hfnn's Evoformer example: "
                  "67.77 -> 47.11 ms a step on an H200), and it shortens the step where the GPU bounds it";
  return a;
}

// 6. GEMM dimensions off the tensor-core multiple (8 in 16-bit, 4 in TF32).
std::optional<Advice> gemm_tensor_core_dims(const RunFacts& f) {
  if (!f.has_cuda || f.rank_steps == 0 || f.cuda_self_total_us <= 0) return std::nullopt;
  double us = 0;
  int64_t calls = 0;
  std::string shown;
  int listed = 0, off = 0;
  for (const auto& g : gemms(f)) {
    const int multiple = tensor_core_multiple(g, f.compute_capability, flag(*g.row, "tf32") == "1");
    if (multiple == 0 || g.row->cuda_total_us <= 0) continue;
    std::string dims;
    for (const auto& [name, value] : {std::pair{"M", g.m}, std::pair{"N", g.n}, std::pair{"K", g.k}})
      if (value % multiple != 0) dims += fmt::format("{}{}", dims.empty() ? "" : ", ", name);
    if (dims.empty()) continue;
    ++off;
    us += g.row->cuda_total_us;
    calls += g.row->calls;
    if (listed++ < 3)
      shown += fmt::format("{}{} ({} not a multiple of {}; {:.2f} ms a step)", shown.empty() ? "" : "; ", g.text(),
                           dims, multiple, ms(f.per_step(g.row->cuda_total_us)));
  }
  const double share = us / f.cuda_self_total_us;
  if (share < kOffMultipleGemmShare) return std::nullopt;
  Advice a;
  a.severity = kSeverityTuning;
  a.title = fmt::format("GEMMs with dimensions off the tensor-core multiple take {:.0f}% of the GPU time", 100 * share);
  a.action = "Pad the model's sizes to multiples of 8 in 16-bit (4 in TF32): hidden and feed-forward widths, the "
             "vocabulary (to a multiple of 64), heads x head size, and batch x sequence length (a Linear's M, which "
             "is the K of its weight gradient)";
  a.evidence = fmt::format("{} GEMM shape{} with a dimension off the multiple, {:.0f} calls and {:.2f} ms of GPU time a "
                           "step, {:.1f}% of the {:.2f} ms the ops account for: {}{}",
                           off, off == 1 ? "" : "s", f.per_step(static_cast<double>(calls)), ms(f.per_step(us)),
                           100 * share, ms(f.per_step(f.cuda_self_total_us)), shown,
                           off > 3 ? fmt::format("; and {} more", off - 3) : std::string());
  a.saving_note = "not estimated: cuBLAS runs such shapes on slower kernels or pads them itself; how much a padded "
                  "shape saves depends on it (time one)";
  return a;
}

// The SDPA cores, as their kernels (kernel_names.h's library) and hfnn tune's core names show them.
struct SdpaCore {
  const char* label;    // for people
  const char* library;  // describe_kernel's library of its kernels ("" for math: no kernel of its own)
  const char* word;     // in the name of hfnn's variant that runs it ("sdpa_flash")
};
constexpr SdpaCore kSdpaCores[] = {{"flash", "flash", "flash"},
                                   {"memory-efficient (cutlass fmha)", "mem_efficient", "efficient"},
                                   {"cuDNN", "cudnn", "cudnn"},
                                   {"math (no fused kernel: matmuls and a softmax)", "", "math"}};
// The math core's op: a composite of bmm, softmax and dropout, whose CUDA total is its forward.
constexpr const char* kSdpaMathOp = "aten::_scaled_dot_product_attention_math";

// 7. The SDPA core in use, where attention is a good part of the GPU time: hfnn tune times every
// core on the run's attention keys, and where it has, says which is fastest.
std::optional<Advice> sdpa_backend(const RunFacts& f) {
  if (!f.has_cuda || f.rank_steps == 0 || f.cuda_self_total_us <= 0) return std::nullopt;
  std::vector<std::pair<double, const SdpaCore*>> used;  // GPU time a step, core
  for (const auto& core : kSdpaCores) {
    double us = 0;
    if (*core.library) {
      for (const auto& [name, k] : f.kernels) {
        const KernelName kn = describe_kernel(name);
        if (kn.category == "attention" && kn.library == core.library) us += k.cuda_us;
      }
    } else {
      us = f.op(kSdpaMathOp).cuda_total_us;
    }
    if (us > 0) used.emplace_back(f.per_step(us), &core);
  }
  double attention_us = 0;
  for (const auto& [us, core] : used) attention_us += us;
  const double share = attention_us / f.per_step(f.cuda_self_total_us);
  if (used.empty() || share < kAttentionShare) return std::nullopt;
  std::sort(used.rbegin(), used.rend());
  std::string in_use;
  for (const auto& [us, core] : used)
    in_use += fmt::format("{}{} {:.2f} ms a step", in_use.empty() ? "" : ", ", core->label, ms(us));
  const SdpaCore& main_core = *used.front().second;
  // The run's attention keys (hfnn tune's: nn.MultiheadAttention calls), by category, not family.
  std::vector<const TuneKey*> keys;
  if (f.tune)
    for (const auto& k : f.tune->keys)
      if (op_category(k.op) == "attention") keys.push_back(&k);
  Advice a;
  a.severity = kSeverityTuning;
  a.title = fmt::format("Attention takes {:.0f}% of the GPU time in SDPA's {} core; another may be faster on these "
                        "shapes", 100 * share, main_core.label);
  a.evidence = fmt::format("SDPA's GPU time by core (from its kernels' names; math: its forward only): {}; {:.1f}% of "
                           "the {:.2f} ms the ops account for",
                           in_use, 100 * share, ms(f.per_step(f.cuda_self_total_us)));
  a.saving_note = "not estimated: hfnn tune measures each core on each key";
  if (f.tune && keys.empty()) {
    a.action = "hfnn tune times the cores on nn.MultiheadAttention calls, and this run has none: time your attention "
               "shapes under torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION, EFFICIENT_ATTENTION, "
               "CUDNN_ATTENTION or MATH) and keep the fastest";
    return a;
  }
  // Tuned on this GPU: which keys another core won (torch's module runs torch's own pick, the core in use).
  std::vector<std::string> faster;
  int tuned = 0;
  for (const auto* k : keys) {
    if (k->winners.empty()) continue;
    ++tuned;
    for (const auto& w : k->winners)
      if (w != "torch" && w.find(main_core.word) == std::string::npos)
        faster.push_back(fmt::format("{} {}", k->label, w));
  }
  const std::string tune_cmd = fmt::format("hfnn tune --db {}", f.db_path);
  if (f.tune) a.evidence += fmt::format("; the run's attention keys: {}", keys_text(keys, basis_words(*f.tune)));
  if (tuned == 0) {  // (or what hfnn tune knows was not given)
    a.action = fmt::format("Run `{}`: it times every core (flash, memory-efficient, cuDNN, math) and torch's module on "
                           "each of these keys and keeps the fastest, which HFNN_DISPATCH_DB={} then runs",
                           tune_cmd, f.db_path);
    return a;
  }
  if (faster.empty()) return std::nullopt;  // tuned, and the core in use (or torch's module) won every key
  a.title = fmt::format("Attention takes {:.0f}% of the GPU time in SDPA's {} core; hfnn tune found another faster on "
                        "{} of {} keys", 100 * share, main_core.label, faster.size(), keys.size());
  a.action = fmt::format("Train with the tuned cores: HFNN_DISPATCH_DB={} python train.py{}", f.db_path,
                         static_cast<size_t>(tuned) < keys.size()
                             ? fmt::format(" (and run `{}` for the {} keys not tuned yet)", tune_cmd, keys.size() - tuned)
                             : std::string());
  a.evidence += fmt::format("; hfnn tune's winners on this GPU: {}", fmt::join(faster, ", "));
  if (const auto it = f.tune->saved_ms_by_op.find(keys.front()->op); it != f.tune->saved_ms_by_op.end() && it->second > 0) {
    a.saving_ms = it->second;
    a.saving_note = fmt::format("hfnn tune's projection for these keys (calls a step times what each winner saves), "
                                "of {}", basis_words(*f.tune));
  }
  return a;
}

// 8. The LayerNorm, attention and LSTM keys hfnn tune would speed up: its projection where it has
// tuned them on this GPU, else the keys and their share of the step.
std::optional<Advice> hfnn_tune(const RunFacts& f) {
  if (!f.has_cuda || !f.tune || f.tune->keys.empty()) return std::nullopt;
  const TuneFacts& t = *f.tune;
  std::vector<const TuneKey*> untuned;
  double untuned_pct = 0, untuned_ms = 0;
  for (const auto& k : t.keys)
    if (k.winners.empty()) {
      untuned.push_back(&k);
      untuned_pct += k.share_pct;
      untuned_ms += k.time_ms;
    }
  const std::string tune_cmd = fmt::format("hfnn tune --db {}", f.db_path);
  const bool projected = t.projection.is_object() &&
                         t.projection.value("saved_ms", 0.0) >= kTunedGainShare * t.projection.value("step_ms", 0.0);
  Advice a;
  a.severity = kSeverityTuning;
  if (projected) {
    a.title = fmt::format("hfnn tune's winners make the step {} faster, by its projection",
                          speedup_text(t.projection["speedup"]));
    a.action = fmt::format("Train with them: HFNN_DISPATCH_DB={} python train.py (every process of the command, "
                           "torchrun too){}",
                           f.db_path,
                           untuned_pct >= kTunableSharePct
                               ? fmt::format("; and run `{}` for the {} keys not tuned on this GPU yet", tune_cmd,
                                             untuned.size())
                               : std::string());
    a.evidence = fmt::format("{}; {}; tuned on {} ({} of the run's {} keys)", projection_text(t.projection),
                             ceiling_text(t.projection), t.env.value("gpu", std::string("this GPU")),
                             t.keys.size() - untuned.size(), t.keys.size());
    if (!untuned.empty()) a.evidence += fmt::format("; not tuned yet: {}", keys_text(untuned, basis_words(t)));
    a.saving_ms = t.projection["saved_ms"].get<double>();
    a.saving_note = "hfnn tune's projection: the step less each tuned key's calls a step times what its winner saves";
    return a;
  }
  if (untuned_pct < kTunableSharePct) return std::nullopt;  // tuned with nothing to gain, or too small to tune
  a.title = fmt::format("{} LayerNorm, attention or LSTM key{} that hfnn tune has not measured take {:.0f}% of the step",
                        untuned.size(), untuned.size() == 1 ? "" : "s", untuned_pct);
  a.action = fmt::format("Run `{}`: it times torch and every hfnn kernel on these keys, keeps the fastest and prints "
                         "the projected step time; then train with HFNN_DISPATCH_DB={} python train.py",
                         tune_cmd, f.db_path);
  a.evidence = fmt::format("{}; {:.2f} ms a step in them", keys_text(untuned, basis_words(t)), untuned_ms);
  a.saving_ms = untuned_ms;
  a.saving_note = "upper bound: their whole time (hfnn tune's ceiling: at zero cost); an attention key's is its "
                  "forward's, and hfnn tune measures what its kernels save";
  return a;
}

using Rule = std::optional<Advice> (*)(const RunFacts&);
// Every rule, by its stable id. A new rule: a function above and a line here.
constexpr std::pair<const char*, Rule> kRules[] = {
    {"cpu_bound_launches", cpu_bound_launches}, {"gpu_idle_host_work", gpu_idle_host_work},
    {"host_device_sync", host_device_sync},     {"autocast_casts", autocast_casts},
    {"optimizer_foreach", optimizer_foreach},   {"tf32_matmuls", tf32_matmuls},
    {"gemm_tensor_core_dims", gemm_tensor_core_dims}, {"sdpa_backend", sdpa_backend},
    {"hfnn_tune", hfnn_tune},
};

}  // namespace

std::string RunFacts::step_text() const {
  if (plain_step_ms)
    return fmt::format("a {:.2f} ms step without the profiler ({:.2f} ms under it)", *plain_step_ms, profiled_step_ms);
  return fmt::format("a {:.2f} ms step under the profiler (no plain step)", step_ms);
}

std::optional<double> RunFacts::plain_share() const {
  if (!plain_step_ms || *plain_step_ms <= 0 || profiled_step_ms <= 0) return std::nullopt;
  return std::min(1.0, *plain_step_ms / profiled_step_ms);
}

OpTotals RunFacts::op(const std::string& name) const {
  const auto it = ops.find(name);
  return it == ops.end() ? OpTotals{} : it->second;
}

RunFacts read_run_facts(Database& db, int64_t run_id, const TuneFactsOf& tune_facts) {
  RunFacts f;
  f.db_path = db.path();
  {
    Statement run(db.handle(), "SELECT gpu, compute_capability FROM runs WHERE id = ?");
    run.bind(1, run_id);
    if (run.step() && !run.column_is_null(0)) {
      f.gpu = run.column_text(0);
      try {
        f.compute_capability = std::stod(run.column_text(1));
      } catch (const std::exception&) {  // none recorded: no rule that needs it applies
      }
    }
  }
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
  // A run that put nothing on the GPU (a CPU-only script on a machine with one) has a busy time of 0
  // a step but no GPU share to speak of: no rule is to tell it the GPU idles between launches.
  if (f.gpu_activities == 0) f.gpu_busy_ms.reset();
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
  Statement shapes(db.handle(),
                   "SELECT op, shape, dtype, flags, sum(calls), coalesce(sum(cpu_total_us), 0),"
                   " coalesce(sum(cuda_total_us), 0) FROM shape_stats WHERE run_id = ? GROUP BY op, shape, dtype, flags");
  shapes.bind(1, run_id);
  while (shapes.step())
    f.shapes.push_back({shapes.column_text(0), shapes.column_text(1), shapes.column_text(2), shapes.column_text(3),
                        shapes.column_int(4), shapes.column_double(5), shapes.column_double(6)});
  Statement kernel_rows(db.handle(), "SELECT name, sum(calls), coalesce(sum(cuda_us), 0) FROM kernel_stats WHERE run_id = ?"
                                     " GROUP BY name");
  kernel_rows.bind(1, run_id);
  while (kernel_rows.step()) f.kernels[kernel_rows.column_text(0)] = {kernel_rows.column_int(1), kernel_rows.column_double(2)};
  if (tune_facts) f.tune = tune_facts(db, run_id);
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
