// profiles/gpu_join: CUDA records joined to the op calls that launched them, as the collector
// hands them over on a GPU (CUPTI's kernel, memcpy and memset records and the external correlation
// records of the launching API calls), without a GPU.
#include "profiles/gpu_join.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace hfnn::profiles {
namespace {

using Intervals = std::vector<std::vector<std::pair<int64_t, int64_t>>>;

GpuRecord kernel(const char* name, uint64_t start, uint64_t end, uint32_t correlation) {
  return {GpuRecord::Kind::kKernel, name, start, end, correlation};
}

// A join holding one call (id 1, adding to `op`) and the correlation 1 -> it.
void one_call(GpuJoin& join, CudaTime& op) {
  join.reset(1);
  join.add_call({1, &op, nullptr, 0, 0});
  join.add({}, {{1, 1}}, nullptr);
}

TEST(GpuJoin, SelfTimeGoesToTheLauncherAndTotalTimeToEveryEnclosingOp) {
  CudaTime outer, middle, inner;
  GpuJoin join;
  join.reset(1);
  join.add_call({1, &outer, nullptr, 0, 0});
  join.add_call({2, &middle, nullptr, 1, 0});
  join.add_call({3, &inner, nullptr, 2, 0});
  Intervals steps(1);
  join.add({kernel("k_inner", 100, 130, 50), kernel("k_middle", 200, 210, 51)}, {{50, 3}, {51, 2}}, &steps);
  EXPECT_EQ(inner.self_ns, 30);
  EXPECT_EQ(inner.total_ns, 30);
  EXPECT_EQ(middle.self_ns, 10);
  EXPECT_EQ(middle.total_ns, 40);
  EXPECT_EQ(outer.self_ns, 0);
  EXPECT_EQ(outer.total_ns, 40);
  EXPECT_EQ(join.attributed, 2);
  ASSERT_EQ(join.kernels().size(), 2u);
  EXPECT_EQ(join.kernels().at("k_inner").ns, 30);
  EXPECT_EQ(steps[0], (std::vector<std::pair<int64_t, int64_t>>{{100, 130}, {200, 210}}));
}

TEST(GpuJoin, AnOpNestedInItselfCountsOnceAndEveryShapeRowAroundTheKernelOnce) {
  // aten::layer_norm under autocast runs inside aten::layer_norm: one op row, counted once. A GEMM
  // inside an attention call: the kernel counts for the GEMM's shape row and the attention key's
  // (the collector keeps only the innermost row of one op and phase, so those around a kernel are
  // of different ops), and a row met twice on the way (a call and its label) counts once.
  CudaTime layer_norm, native, attention_key, gemm_shape;
  GpuJoin join;
  join.reset(10);
  join.add_call({10, &layer_norm, &attention_key, 0, 0});
  join.add_call({11, &layer_norm, &attention_key, 10, 0});
  join.add_call({12, &native, &gemm_shape, 11, 0});
  join.add_call({13, nullptr, nullptr, 12, 0});  // a label (shape scope): no op row of its own
  join.add({kernel("k", 0, 7, 1), kernel("k", 10, 15, 2)}, {{1, 12}, {2, 13}}, nullptr);
  EXPECT_EQ(native.self_ns, 7);
  EXPECT_EQ(native.total_ns, 12);
  EXPECT_EQ(layer_norm.total_ns, 12);
  EXPECT_EQ(layer_norm.self_ns, 0);
  EXPECT_EQ(gemm_shape.total_ns, 12);
  EXPECT_EQ(attention_key.total_ns, 12);
  EXPECT_EQ(join.kernels().at("k").calls, 2);
}

TEST(GpuJoin, RecordsWithoutACorrelationOrACallAreCountedNotAttributed) {
  CudaTime op;
  GpuJoin join;
  join.reset(5);
  join.add_call({4, &op, nullptr, 0, 0});  // from before the reset: not kept
  join.add_call({5, &op, nullptr, 0, 0});
  join.add({kernel("a", 0, 1, 1), kernel("b", 0, 1, 2), kernel("c", 0, 1, 3)}, {{1, 4}, {3, 5}}, nullptr);
  EXPECT_EQ(join.no_op, 1);           // correlation 1 names call 4, forgotten
  EXPECT_EQ(join.no_correlation, 1);  // correlation 2 launched outside any recorded op
  EXPECT_EQ(join.attributed, 1);
  EXPECT_EQ(join.records, 3);
  EXPECT_EQ(join.correlations, 2);
  EXPECT_EQ(op.self_ns, 1);
}

TEST(GpuJoin, CorrelationsArriveOutOfOrderAndBeforeTheirKernels) {
  // CUPTI writes an API call's record when it returns (threads interleave), and a kernel's record
  // when the kernel is done, often in a later buffer than its launch's.
  CudaTime a, b, c;
  GpuJoin join;
  join.reset(1);
  join.add_call({1, &a, nullptr, 0, 0});
  join.add_call({2, &b, nullptr, 0, 0});
  join.add_call({3, &c, nullptr, 0, 0});
  join.add({}, {{30, 3}, {10, 1}}, nullptr);
  join.add({kernel("k", 0, 3, 20), kernel("k", 0, 1, 10)}, {{20, 2}}, nullptr);
  join.add({kernel("k", 0, 5, 30)}, {}, nullptr);
  EXPECT_EQ(a.self_ns, 1);
  EXPECT_EQ(b.self_ns, 3);
  EXPECT_EQ(c.self_ns, 5);
  EXPECT_EQ(join.no_correlation, 0);
}

TEST(GpuJoin, OldStepsAreForgottenWithTheirCorrelations) {
  CudaTime op;
  GpuJoin join;
  join.reset(1);
  for (uint64_t id = 1; id <= 6; ++id) join.add_call({id, &op, nullptr, 0, static_cast<int>((id - 1) / 2)});
  join.add({}, {{1, 1}, {2, 3}, {3, 5}}, nullptr);
  join.forget_before(3);  // steps from call 3 on are kept
  EXPECT_EQ(join.calls_kept(), 4u);
  Intervals steps(3);
  join.add({kernel("k", 0, 1, 1), kernel("k", 4, 6, 2), kernel("k", 7, 8, 3)}, {}, &steps);
  EXPECT_EQ(join.no_correlation, 1);  // its correlation went with call 1
  EXPECT_EQ(join.attributed, 2);
  EXPECT_TRUE(steps[0].empty());
  EXPECT_EQ(steps[1], (std::vector<std::pair<int64_t, int64_t>>{{4, 6}}));
  EXPECT_EQ(steps[2], (std::vector<std::pair<int64_t, int64_t>>{{7, 8}}));
  join.forget_before(UINT64_MAX);  // CUDA activity over: nothing kept, the kernels' totals stay
  EXPECT_EQ(join.calls_kept(), 0u);
  EXPECT_EQ(join.kernels().at("k").calls, 2);
}

TEST(GpuJoin, KernelNamesAreTheirTextNotTheirAddress) {
  CudaTime op;
  GpuJoin join;
  one_call(join, op);
  char first[] = "kernel_one", second[] = "kernel_one";
  join.add({kernel(first, 0, 1, 1), kernel(second, 0, 2, 1)}, {}, nullptr);
  ASSERT_EQ(join.kernels().size(), 1u);
  EXPECT_EQ(join.kernels().at("kernel_one").calls, 2);
  std::strcpy(first, "kernel_two");  // one address, another name
  join.add({kernel(first, 0, 4, 1)}, {}, nullptr);
  ASSERT_EQ(join.kernels().size(), 2u);
  EXPECT_EQ(join.kernels().at("kernel_two").ns, 4);
  EXPECT_EQ(join.kernels().at("kernel_one").ns, 3);
}

TEST(GpuJoin, TheDevicesOfEveryRecordAreKeptThroughAReset) {
  // The devices the recorded kernels ran on are the ones the collector drains (under torchrun
  // without set_device, not the thread's current one): every record's, attributed or not.
  CudaTime op;
  GpuJoin join;
  one_call(join, op);
  GpuRecord on_one = kernel("k", 0, 1, 1), unattributed = kernel("nccl", 0, 1, 99), on_one_again = on_one;
  on_one.device = on_one_again.device = 1;
  unattributed.device = 3;
  join.add({on_one, unattributed, on_one_again}, {}, nullptr);
  EXPECT_EQ(join.devices(), (std::vector<uint32_t>{1, 3}));
  join.reset(100);  // a warm-up forgotten: its kernels ran where the recorded steps' do
  EXPECT_EQ(join.devices(), (std::vector<uint32_t>{1, 3}));
}

TEST(GpuJoin, ResetForgetsEverything) {
  CudaTime op;
  GpuJoin join;
  one_call(join, op);
  join.add({kernel("k", 0, 1, 1)}, {}, nullptr);
  EXPECT_EQ(op.self_ns, 1);
  join.reset(100);
  EXPECT_TRUE(join.kernels().empty());
  EXPECT_EQ(join.calls_kept(), 0u);
  join.add({kernel("k", 0, 1, 1)}, {}, nullptr);  // the correlation went too
  EXPECT_EQ(join.no_correlation, 1);
}

}  // namespace
}  // namespace hfnn::profiles
