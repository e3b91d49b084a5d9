// The LayerNorm variant tables. Names are stable: the dispatch database stores them.
#include <array>

#include "kernels/layer_norm/layer_norm_variants.h"

namespace hfnn::kernels::layer_norm {
namespace {

template <int kTpr, int kRows>
constexpr FwdVariant fwd_regs(std::string_view name) {
  return {name,
          kRows == 1 ? "row in registers, a group of threads per row, the widest accesses the rows allow"
                     : "as fwd_regs, two rows per group at once (small rows: more loads in flight)",
          &fwd_regs_supports<kTpr, kRows>, &fwd_regs_run<kTpr, kRows>};
}

template <int kTpr, int kRows>
constexpr BwdVariant bwd_regs(std::string_view name) {
  return {name,
          kRows == 1 ? "row in registers, persistent grid, dgamma/dbeta summed in registers, fixed-order fold"
                     : "as bwd_regs, two rows per group at once (small rows: more loads in flight)",
          &bwd_regs_supports<kTpr, kRows>, &bwd_regs_workspace<kTpr, kRows>, &bwd_regs_run<kTpr, kRows>};
}

template <int kCluster, bool kStaged = false>
constexpr FwdVariant fwd_wide(std::string_view name) {
  return {name,
          kStaged ? "as fwd_wide_c*, on a persistent grid whose blocks convert gamma and beta once into shared "
                    "memory as floats: many rows"
          : kCluster == 1 ? "row in registers across a block of whole warps, summed through shared memory: wide rows"
                          : "row split over the blocks of a thread-block cluster, sums met in distributed shared "
                            "memory: the widest rows, few rows still fill the GPU (Hopper)",
          &fwd_wide_supports<kCluster, kStaged>, &fwd_wide_run<kCluster, kStaged>};
}

// kSmem: each thread's dgamma/dbeta sums in shared memory instead of registers.
template <int kCluster, bool kSmem = false>
constexpr BwdVariant bwd_wide(std::string_view name) {
  return {name,
          kSmem ? "as bwd_wide_c*, each thread's dgamma/dbeta sums in shared memory: fewer registers, more blocks "
                  "an SM and more loads in flight (16-bit)"
          : kCluster == 1 ? "row in registers across a block of whole warps, persistent grid, dgamma/dbeta in "
                            "registers: wide rows"
                          : "row split over the blocks of a thread-block cluster, sums met in distributed shared "
                            "memory, persistent grid: the widest rows (Hopper)",
          &bwd_wide_supports<kCluster, kSmem>, &bwd_wide_workspace<kCluster, kSmem>, &bwd_wide_run<kCluster, kSmem>};
}

std::size_t no_workspace(const BwdParams&) { return 0; }

// As bwd_wide_c*(_smem), dx alone, then dgamma/dbeta summed down the columns by their own kernel.
template <int kCluster, bool kSmem>
constexpr BwdVariant bwd_wide_cols(std::string_view name) {
  return {name,
          "as bwd_wide_c*, dx alone, then dgamma/dbeta summed down the columns from x and dy read again (no "
          "partial rows): few wide rows",
          &bwd_cols_supports<&bwd_wide_supports<kCluster, kSmem>, &bwd_wide_run<kCluster, kSmem>>, &no_workspace,
          &bwd_cols_run<&bwd_wide_supports<kCluster, kSmem>, &bwd_wide_run<kCluster, kSmem>>};
}

template <int kCluster, bool kStaged = true>
constexpr FwdVariant fwd_wide_win(std::string_view name) {
  return {name,
          kStaged ? "as fwd_wide_c*_ps, for rows not 16-byte aligned: 16-byte accesses through their aligned "
                    "windows, blocks by row lead"
                  : "as fwd_wide_c*, for rows not 16-byte aligned: 16-byte accesses through their aligned windows, a "
                    "cluster a row, gamma and beta shifted into place as it goes: few rows",
          &fwd_wide_win_supports<kCluster, kStaged>, &fwd_wide_win_run<kCluster, kStaged>};
}

// The window backward's dx alone, then dgamma/dbeta summed down the columns.
template <int kCluster>
constexpr BwdVariant bwd_wide_win_cols(std::string_view name) {
  return {name,
          "as bwd_wide_c*_cols, for rows not 16-byte aligned: dx in 16-byte accesses through their aligned windows, "
          "blocks by row lead, then dgamma/dbeta summed down the columns",
          &bwd_cols_supports<&bwd_wide_win_supports<kCluster, false>, &bwd_wide_win_run<kCluster, false>>,
          &no_workspace, &bwd_cols_run<&bwd_wide_win_supports<kCluster, false>, &bwd_wide_win_run<kCluster, false>>};
}

// The window backward with its dgamma/dbeta sums (in shared memory, by window position).
template <int kCluster>
constexpr BwdVariant bwd_wide_win_smem(std::string_view name) {
  return {name,
          "as bwd_wide_c*_smem, for rows not 16-byte aligned: 16-byte accesses through their aligned windows, "
          "blocks by row lead, dgamma/dbeta summed by window position (x and dy read once)",
          &bwd_wide_win_supports<kCluster, true>, &bwd_wide_win_workspace<kCluster>, &bwd_wide_win_run<kCluster, true>};
}

template <int kTpr>
constexpr FwdVariant fwd_window(std::string_view name) {
  return {name, "rows not 16-byte aligned in 16-byte accesses through their aligned windows, blocks by row lead",
          &fwd_window_supports<kTpr>, &fwd_window_run<kTpr>};
}

template <int kTpr, bool kSmem = false>
constexpr BwdVariant bwd_window(std::string_view name) {
  return {name,
          kSmem ? "rows not 16-byte aligned in 16-byte accesses through their aligned windows, blocks by row lead, "
                  "dgamma/dbeta in shared memory (rows of over 8 elements a lane)"
                : "rows not 16-byte aligned in 16-byte accesses through their aligned windows, blocks by row lead, "
                  "dgamma/dbeta in registers",
          &bwd_window_supports<kTpr, kSmem>, &bwd_window_workspace<kTpr, kSmem>, &bwd_window_run<kTpr, kSmem>};
}

template <int kTpr>
constexpr FwdVariant fwd_flat(std::string_view name) {
  return {name,
          "narrow rows at any alignment: tiles of consecutive rows moved in 16-byte packs through shared memory, a "
          "group of threads a row",
          &fwd_flat_supports<kTpr>, &fwd_flat_run<kTpr>};
}

constexpr std::array kFwd = {
    fwd_regs<4, 1>("fwd_regs_tpr4"),
    fwd_regs<8, 1>("fwd_regs_tpr8"),
    fwd_regs<16, 1>("fwd_regs_tpr16"),
    fwd_regs<32, 1>("fwd_regs_tpr32"),
    fwd_regs<4, 2>("fwd_regs_tpr4_r2"),
    fwd_regs<8, 2>("fwd_regs_tpr8_r2"),
    fwd_regs<16, 2>("fwd_regs_tpr16_r2"),
    fwd_regs<32, 2>("fwd_regs_tpr32_r2"),
    FwdVariant{"fwd_block",
               "block per row, row staged in shared memory (or re-read), any cols and alignment (odd widths "
               "through 16-byte windows)",
               &fwd_block_supports, &fwd_block_run},
    fwd_wide<1>("fwd_wide_c1"),
    fwd_wide<2>("fwd_wide_c2"),
    fwd_wide<4>("fwd_wide_c4"),
    fwd_wide<8>("fwd_wide_c8"),
    fwd_wide<16>("fwd_wide_c16"),
    fwd_wide<1, true>("fwd_wide_c1_ps"),
    fwd_wide<2, true>("fwd_wide_c2_ps"),
    fwd_wide<4, true>("fwd_wide_c4_ps"),
    fwd_wide<8, true>("fwd_wide_c8_ps"),
    fwd_wide<16, true>("fwd_wide_c16_ps"),
    fwd_window<4>("fwd_win_tpr4"),
    fwd_window<8>("fwd_win_tpr8"),
    fwd_window<16>("fwd_win_tpr16"),
    fwd_window<32>("fwd_win_tpr32"),
    fwd_wide_win<1>("fwd_wide_win_c1"),
    fwd_wide_win<2>("fwd_wide_win_c2"),
    fwd_wide_win<4>("fwd_wide_win_c4"),
    fwd_wide_win<8>("fwd_wide_win_c8"),
    fwd_wide_win<16>("fwd_wide_win_c16"),
    fwd_wide_win<1, false>("fwd_wide_win_c1_direct"),
    fwd_wide_win<2, false>("fwd_wide_win_c2_direct"),
    fwd_wide_win<4, false>("fwd_wide_win_c4_direct"),
    fwd_wide_win<8, false>("fwd_wide_win_c8_direct"),
    fwd_wide_win<16, false>("fwd_wide_win_c16_direct"),
    fwd_flat<4>("fwd_flat_tpr4"),
    fwd_flat<8>("fwd_flat_tpr8"),
    fwd_flat<16>("fwd_flat_tpr16"),
    fwd_flat<32>("fwd_flat_tpr32"),
    fwd_flat<64>("fwd_flat_tpr64"),
    fwd_flat<128>("fwd_flat_tpr128"),
};

constexpr std::array kBwd = {
    bwd_regs<4, 1>("bwd_regs_tpr4"),
    bwd_regs<8, 1>("bwd_regs_tpr8"),
    bwd_regs<16, 1>("bwd_regs_tpr16"),
    bwd_regs<32, 1>("bwd_regs_tpr32"),
    bwd_regs<4, 2>("bwd_regs_tpr4_r2"),
    bwd_regs<8, 2>("bwd_regs_tpr8_r2"),
    bwd_regs<16, 2>("bwd_regs_tpr16_r2"),
    bwd_regs<32, 2>("bwd_regs_tpr32_r2"),
    BwdVariant{"bwd_block", "block per row, persistent grid, dgamma/dbeta partials in shared memory, any cols",
               &bwd_block_supports<false>, &bwd_block_workspace<false>, &bwd_block_run<false>},
    bwd_wide<1>("bwd_wide_c1"),
    bwd_wide<2>("bwd_wide_c2"),
    bwd_wide<4>("bwd_wide_c4"),
    bwd_wide<8>("bwd_wide_c8"),
    bwd_wide<16>("bwd_wide_c16"),
    bwd_wide<1, true>("bwd_wide_c1_smem"),
    bwd_wide<2, true>("bwd_wide_c2_smem"),
    bwd_wide<4, true>("bwd_wide_c4_smem"),
    bwd_wide<8, true>("bwd_wide_c8_smem"),
    bwd_wide<16, true>("bwd_wide_c16_smem"),
    bwd_window<4>("bwd_win_tpr4"),
    bwd_window<8>("bwd_win_tpr8"),
    bwd_window<16>("bwd_win_tpr16"),
    bwd_window<32>("bwd_win_tpr32"),
    bwd_window<4, true>("bwd_win_tpr4_smem"),
    bwd_window<8, true>("bwd_win_tpr8_smem"),
    bwd_window<16, true>("bwd_win_tpr16_smem"),
    bwd_window<32, true>("bwd_win_tpr32_smem"),
    BwdVariant{"bwd_block_win",
               "bwd_block for rows aligned to an element only, read and written through 16-byte windows",
               &bwd_block_supports<true>, &bwd_block_workspace<true>, &bwd_block_run<true>},
    bwd_wide_cols<1, false>("bwd_wide_c1_cols"),
    bwd_wide_cols<2, false>("bwd_wide_c2_cols"),
    bwd_wide_cols<4, false>("bwd_wide_c4_cols"),
    bwd_wide_cols<8, false>("bwd_wide_c8_cols"),
    bwd_wide_cols<16, false>("bwd_wide_c16_cols"),
    bwd_wide_cols<1, true>("bwd_wide_c1_smem_cols"),
    bwd_wide_cols<2, true>("bwd_wide_c2_smem_cols"),
    bwd_wide_cols<4, true>("bwd_wide_c4_smem_cols"),
    bwd_wide_cols<8, true>("bwd_wide_c8_smem_cols"),
    bwd_wide_cols<16, true>("bwd_wide_c16_smem_cols"),
    BwdVariant{"bwd_block_cols", "as bwd_block, dx alone, then dgamma/dbeta summed down the columns: few wide rows",
               &bwd_cols_supports<&bwd_block_supports<false>, &bwd_block_run<false>>, &no_workspace,
               &bwd_cols_run<&bwd_block_supports<false>, &bwd_block_run<false>>},
    BwdVariant{"bwd_block_win_cols",
               "as bwd_block_win, dx alone, then dgamma/dbeta summed down the columns: few wide rows aligned to an "
               "element",
               &bwd_cols_supports<&bwd_block_supports<true>, &bwd_block_run<true>>, &no_workspace,
               &bwd_cols_run<&bwd_block_supports<true>, &bwd_block_run<true>>},
    bwd_wide_win_cols<1>("bwd_wide_win_c1_cols"),
    bwd_wide_win_cols<2>("bwd_wide_win_c2_cols"),
    bwd_wide_win_cols<4>("bwd_wide_win_c4_cols"),
    bwd_wide_win_cols<8>("bwd_wide_win_c8_cols"),
    bwd_wide_win_cols<16>("bwd_wide_win_c16_cols"),
    bwd_wide_win_smem<1>("bwd_wide_win_c1_smem"),
    bwd_wide_win_smem<2>("bwd_wide_win_c2_smem"),
    bwd_wide_win_smem<4>("bwd_wide_win_c4_smem"),
    bwd_wide_win_smem<8>("bwd_wide_win_c8_smem"),
    bwd_wide_win_smem<16>("bwd_wide_win_c16_smem"),
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
