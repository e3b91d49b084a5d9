// Kernel names as people read them, and what a kernel or an op is.
//
// CUPTI reports a kernel by its mangled C++ name (`_ZN2at6native29vectorized_elementwise_kernel...`)
// or, for C kernels such as cuBLAS's, by its plain name (`nvjet_sm90_tst_...`). The database keeps
// that raw name, as every hfnn before kept it, so older files read the same; the reports demangle it
// as Kineto does (libkineto/src/Demangle.cpp: abi::__cxa_demangle; the full name is torch.profiler's
// key for the kernel) and cut it to the width of torch.profiler's name column
// (torch/autograd/profiler_util.py, max_name_column_width = 55).
//
// Ops and kernels fall in the same categories (kCategories), so an op and the kernels it launches
// are drawn alike: aten::mm and nvjet_sm90_... are gemm, aten::copy_ and its direct_copy kernels
// are copy, aten::sum and at::native::reduce_kernel are reduction.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace hfnn::profiles {

// What an op or a kernel computes. "other" is the last: names no rule knows.
inline constexpr const char* kCategories[] = {"gemm",        "conv",      "attention", "layer_norm",
                                              "norm",        "softmax",   "reduction", "elementwise",
                                              "copy",        "communication", "lstm",  "other"};

// torch.profiler's name column (torch/autograd/profiler_util.py: max_name_column_width = 55).
inline constexpr size_t kShortNameWidth = 55;

// A mangled C++ name (`_Z...`) demangled by abi::__cxa_demangle; any other name, or one the ABI
// cannot read, as it is. Only `_Z` names: the ABI also reads bare type codes ("t" is "unsigned
// short"), which torch guards against by leaving one-letter names alone. Names over 1,024
// characters stay mangled, as in torch.profiler: libstdc++'s demangler refuses them (its stack
// guard, 2 components a character against a limit of 2,048), and Kineto does not ask.
std::string demangle(std::string_view raw);

// The name a table shows: the demangled name without the parts that tell kernels apart least, its
// return type ("void "), "(anonymous namespace)::" and its parameter list (which repeats the template
// arguments), then cut as torch.profiler cuts its name column: width - 3 characters or more to the
// first width - 3 and "...". Cut as it is, every hfnn LayerNorm kernel read the same
// "void hfnn::kernels::layer_norm::(anonymous namespace..." and most of torch's as many
// "void at::native::(anonymous namespace)::...".
std::string shorten(std::string_view demangled, size_t width = kShortNameWidth);

struct KernelName {
  std::string raw;         // as CUPTI reported it and the database keeps it
  std::string full;        // demangled (raw where it is not a mangled C++ name)
  std::string short_name;  // what the text and HTML tables show: shorten(full)
  std::string category;    // one of kCategories
  // Who wrote it: "cublas" (nvjet, xmma, gemv, ...), "cutlass", "cudnn", "flash" (flash attention),
  // "mem_efficient" (torch's memory-efficient attention), "nccl", "triton", "cub", "aten" (torch's
  // own kernels), "hfnn", "cuda" (memcpy, memset); "" when no rule knows.
  std::string library;
};

// The kernel as the reports show and colour it.
KernelName describe_kernel(std::string_view raw);

// The category of an op (a RecordFunction name: "aten::addmm", "AddmmBackward0", "hfnn::layer_norm",
// "nccl:all_reduce"), in the same categories as its kernels.
std::string op_category(std::string_view op_name);

}  // namespace hfnn::profiles
