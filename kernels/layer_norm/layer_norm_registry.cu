// The LayerNorm variant tables. Names are stable: the dispatch database stores them.
#include <array>

#include "kernels/layer_norm/layer_norm_variants.h"

namespace hfnn::kernels::layer_norm {
namespace {

template <int kTpr>
constexpr FwdVariant fwd_regs(std::string_view name) {
  return {name, "row in registers, a group of threads per row, 16-byte accesses", &fwd_regs_supports<kTpr>,
          &fwd_regs_run<kTpr>};
}

template <int kTpr>
constexpr BwdVariant bwd_regs(std::string_view name) {
  return {name, "row in registers, persistent grid, dgamma/dbeta summed in registers, fixed-order fold",
          &bwd_regs_supports<kTpr>, &bwd_regs_workspace<kTpr>, &bwd_regs_run<kTpr>};
}

constexpr std::array kFwd = {
    fwd_regs<4>("fwd_regs_tpr4"),
    fwd_regs<8>("fwd_regs_tpr8"),
    fwd_regs<16>("fwd_regs_tpr16"),
    fwd_regs<32>("fwd_regs_tpr32"),
    FwdVariant{"fwd_block", "block per row, row staged in shared memory, any cols", &fwd_block_supports,
               &fwd_block_run},
};

constexpr std::array kBwd = {
    bwd_regs<4>("bwd_regs_tpr4"),
    bwd_regs<8>("bwd_regs_tpr8"),
    bwd_regs<16>("bwd_regs_tpr16"),
    bwd_regs<32>("bwd_regs_tpr32"),
    BwdVariant{"bwd_block", "block per row, persistent grid, dgamma/dbeta partials in shared memory, any cols",
               &bwd_block_supports, &bwd_block_workspace, &bwd_block_run},
};

}  // namespace

std::span<const FwdVariant> fwd_variants() { return kFwd; }
std::span<const BwdVariant> bwd_variants() { return kBwd; }

const FwdVariant* find_fwd(std::string_view name) {
  for (const auto& v : kFwd)
    if (v.name == name) return &v;
  return nullptr;
}

const BwdVariant* find_bwd(std::string_view name) {
  for (const auto& v : kBwd)
    if (v.name == name) return &v;
  return nullptr;
}

}  // namespace hfnn::kernels::layer_norm
