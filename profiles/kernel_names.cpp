#include "profiles/kernel_names.h"

#include <cxxabi.h>

#include <cctype>
#include <cstdlib>
#include <initializer_list>
#include <memory>

namespace hfnn::profiles {
namespace {

bool starts(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool has(std::string_view s, std::string_view word) { return s.find(word) != std::string_view::npos; }

bool has_any(std::string_view s, std::initializer_list<std::string_view> words) {
  for (const auto w : words)
    if (has(s, w)) return true;
  return false;
}

bool is_one_of(std::string_view s, std::initializer_list<std::string_view> words) {
  for (const auto w : words)
    if (s == w) return true;
  return false;
}

// Lower case without underscores, so that "LayerNorm", "layer_norm" and "NativeLayerNormBackward0"
// all read "layernorm" to the rules below.
std::string normalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s)
    if (c != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The source files a mangled name was compiled from, normalized: nvcc names each anonymous
// namespace after its file (`_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a`), which
// demangling turns into "(anonymous namespace)". The file is what says that
// GammaBetaBackwardCUDAKernelTemplate is LayerNorm's and batch_norm_elementwise's lambda is
// BatchNorm's.
std::string file_hints(std::string_view raw) {
  constexpr std::string_view kAnon = "_GLOBAL__N__";
  std::string files;
  for (size_t at = raw.find(kAnon); at != std::string_view::npos; at = raw.find(kAnon, at + 1)) {
    size_t i = at + kAnon.size();
    while (i < raw.size() && std::isxdigit(static_cast<unsigned char>(raw[i]))) ++i;  // the file's hash
    if (i < raw.size() && raw[i] == '_') ++i;
    while (i < raw.size() && std::isdigit(static_cast<unsigned char>(raw[i]))) ++i;  // its name's length
    if (i < raw.size() && raw[i] == '_') ++i;
    const size_t end = raw.find("_cu_", i);
    if (end != std::string_view::npos && end - i < 128) files += " " + normalize(raw.substr(i, end - i));
  }
  return files;
}

// The kernel's qualified function name: its demangled name without the return type, the template
// arguments and the parameters ("at::native::vectorized_elementwise_kernel").
std::string_view function_of(std::string_view full) {
  if (starts(full, "void ")) full.remove_prefix(5);
  constexpr std::string_view kAnon = "(anonymous namespace)";
  size_t i = 0;
  while (i < full.size() && full[i] != '<' && full[i] != '(')
    i += full.compare(i, kAnon.size(), kAnon) == 0 ? kAnon.size() : 1;
  return full.substr(0, i);
}

// What a kernel or op computes, from the words in its names (normalized); "" when none says.
// Order matters: LayerNorm's backward reduces and a cast runs in an elementwise kernel, and they are
// LayerNorm and copy.
std::string_view category_from_words(std::string_view s) {
  if (has(s, "rmsnorm")) return "norm";
  if (has(s, "layernorm")) return "layer_norm";
  if (has(s, "softmax")) return "softmax";
  if (has_any(s, {"batchnorm", "groupnorm", "instancenorm", "normalization"})) return "norm";
  if (has_any(s, {"attention", "fmha", "flash", "sdpa"})) return "attention";
  if (has_any(s, {"lstm", "grucell", "rnn"})) return "lstm";
  if (has_any(s, {"convolution", "convdepthwise", "conv1d", "conv2d", "conv3d", "convtranspose", "slowconv", "im2col",
                  "col2im", "vol2col", "col2vol"}))
    return "conv";
  if (has_any(s, {"copykernel", "catarray", "memcpy", "memset"})) return "copy";
  if (has_any(s, {"reducekernel", "devicereduce", "segmentedreduce", "lpnorm", "reduction"})) return "reduction";
  if (has_any(s, {"elementwise", "multitensorapply", "dropout", "pointwise", "fillfunctor"})) return "elementwise";
  if (has_any(s, {"gemm", "gemv", "matmul"})) return "gemm";
  return {};
}

// cuDNN's kernels: convolutions mostly (xmma implicit GEMMs: fprop, dgrad, wgrad; the older
// <arch>_scudnn_... families), its SDPA (with the backward's helpers, dot(dO, O) and dQ's
// conversion: seen on an H200), RNNs, BatchNorm and layout changes.
std::string_view cudnn_category(std::string_view s) {
  if (has_any(s, {"sdpa", "fmha", "flash", "attention", "dotdoo", "convertdq"})) return "attention";
  if (has_any(s, {"rnn", "lstm", "gru", "persist"})) return "lstm";
  if (has_any(s, {"fprop", "dgrad", "wgrad", "convolution", "convolve", "conv2d", "conv3d", "implicitgemm", "winograd",
                  "fft", "scudnn", "hcudnn", "884cudnn", "1688cudnn", "16816cudnn"}))
    return "conv";
  if (has_any(s, {"bnfw", "bnbw", "batchnorm"})) return "norm";
  if (has_any(s, {"nchwtonhwc", "nhwctonchw", "transpose", "padding"})) return "copy";
  if (has(s, "gemm")) return "gemm";
  return "other";
}

// cuBLAS and cuBLASLt GEMMs other than nvjet: sm90_xmma_gemm_..., ampere_sgemm_..., gemv2T_kernel,
// gemmk1_kernel, splitKreduce_kernel, cublasLt::...
bool is_cublas(std::string_view fn, std::string_view words) {
  if (has(words, "cublas")) return true;
  const std::string_view head = fn.substr(0, 10);  // ampere_sgemm_..., volta_h884gemm_...
  if (has(fn, "gemm") && (has(fn, "xmma") || has_any(head, {"ampere", "volta", "turing", "maxwell", "hopper"})))
    return true;
  return has_any(fn, {"gemv", "gemmk1", "gemmsn", "splitkreduce"});
}

}  // namespace

std::string demangle(std::string_view raw) {
  if (!starts(raw, "_Z")) return std::string(raw);
  const std::string name(raw);
  int status = 0;
  const std::unique_ptr<char, decltype(&std::free)> out(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status),
                                                        &std::free);
  return status == 0 && out ? std::string(out.get()) : name;
}

std::string shorten(std::string_view demangled, size_t width) {
  if (starts(demangled, "void ")) demangled.remove_prefix(5);
  constexpr std::string_view kAnon = "(anonymous namespace)::";
  std::string name;
  int angles = 0, parens = 0;
  for (size_t i = 0; i < demangled.size(); ++i) {
    if (demangled.compare(i, kAnon.size(), kAnon) == 0) {
      i += kAnon.size() - 1;
      continue;
    }
    const char c = demangled[i];
    if (c == '(' && angles == 0 && parens == 0 && !name.empty()) break;  // the parameters
    angles += c == '<' ? 1 : c == '>' ? -1 : 0;
    parens += c == '(' ? 1 : c == ')' ? -1 : 0;
    name += c;
  }
  const size_t keep = width > 3 ? width - 3 : 0;
  if (name.size() < keep) return name;
  return name.substr(0, keep) + "...";
}

KernelName describe_kernel(std::string_view raw) {
  KernelName k{std::string(raw), demangle(raw), {}, {}, {}};
  k.short_name = shorten(k.full);
  const std::string_view function = function_of(k.full);
  const std::string fn = normalize(function), words = normalize(k.full) + file_hints(raw);
  auto is = [&](std::string_view category, const char* library) {
    k.category = category;
    k.library = library;
    return k;
  };
  if (raw == "[memcpy]" || raw == "[memset]") return is("copy", "cuda");  // profiles/cupti_activity.cpp's labels
  if (starts(fn, "nccl")) return is("communication", "nccl");
  if (starts(fn, "nvjet")) return is("gemm", "cublas");  // Hopper's cuBLAS GEMMs
  if (has(words, "cudnn") || (has(fn, "xmma") && has_any(fn, {"fprop", "dgrad", "wgrad"})))
    return is(cudnn_category(words), "cudnn");
  if (starts(function, "hfnn::")) {  // hfnn::kernels::<family>::...: the family says what it is
    std::string_view c = category_from_words(normalize(function));
    if (c.empty()) c = category_from_words(words);
    return is(c.empty() ? "other" : c, "hfnn");
  }
  if (has(fn, "flash")) return is("attention", "flash");
  if (has_any(words, {"fmhacutlass", "pytorchmemeffattention"})) return is("attention", "mem_efficient");
  if (starts(fn, "triton")) {  // inductor's kernels: pointwise, reduction, persistent reduction, template
    if (starts(fn, "tritonpoi")) return is("elementwise", "triton");
    if (starts(fn, "tritonred") || starts(fn, "tritonper")) return is("reduction", "triton");
    if (starts(fn, "tritontem")) return is("gemm", "triton");
    const std::string_view c = category_from_words(words);
    return is(c.empty() ? "other" : c, "triton");
  }
  if (is_cublas(fn, words)) return is("gemm", "cublas");
  if (has(words, "cutlass"))
    return is(has_any(words, {"conv::", "convolution", "fprop", "dgrad", "wgrad"}) ? "conv" : "gemm", "cutlass");
  const char* library = has(function, "cub::")                                      ? "cub"
                        : starts(function, "at::") || starts(function, "c10::")    ? "aten"
                                                                                    : "";
  std::string_view c = category_from_words(words);
  // torch's kernels no rule names (indexing, losses, sorting) count as elementwise, as the aten ops
  // no rule names do in op_category: the two tables agree.
  if (c.empty()) c = std::string_view(library) == "aten" ? "elementwise" : "other";
  return is(c, library);
}

std::string op_category(std::string_view name) {
  constexpr std::string_view kNode = "autograd::engine::evaluate_function: ";
  if (starts(name, kNode)) name.remove_prefix(kNode.size());
  const std::string all = normalize(name);
  // The op's own word: "addmm" for "aten::addmm", "aten::addmm_" and "AddmmBackward0".
  std::string_view word = all;
  if (const size_t ns = word.rfind("::"); ns != std::string_view::npos) word.remove_prefix(ns + 2);
  while (!word.empty() && std::isdigit(static_cast<unsigned char>(word.back()))) word.remove_suffix(1);
  if (word.size() > 8 && word.substr(word.size() - 8) == "backward") word.remove_suffix(8);

  if (has_any(all, {"nccl", "c10d", "allreduce", "allgather", "reducescatter", "alltoall", "gloo"}))
    return "communication";
  if (word == "gru") return "lstm";  // aten::gru (its cells' ops say grucell, as their kernels do)
  // The words that name kernels name their ops too: layer_norm, softmax, batch_norm, attention,
  // lstm, convolution, matmul, dropout.
  if (const std::string_view c = category_from_words(all); !c.empty()) return std::string(c);
  if (is_one_of(word, {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "einsum", "scaledmm", "addmv",
                       "mv", "dot", "vdot", "addmmactivation"}) ||
      has(all, "cublas"))
    return "gemm";
  if (is_one_of(word, {"copy", "tocopy", "to", "clone", "contiguous", "copyfrom", "copyfromandresize", "cat"}))
    return "copy";
  if (is_one_of(word, {"sum", "mean", "amax", "amin", "max", "min", "aminmax", "argmax", "argmin", "prod", "var", "std",
                       "varmean", "stdmean", "norm", "linalgvectornorm", "foreachnorm", "all", "any", "logsumexp",
                       "nansum", "countnonzero"}))
    return "reduction";
  if (starts(all, "aten::")) return "elementwise";  // the remaining aten ops: pointwise, indexing, fills, losses
  return "other";
}

}  // namespace hfnn::profiles
