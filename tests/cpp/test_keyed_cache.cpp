// The caches behind kernels/common/gemm.cpp (kernels/common/keyed_cache.h), on the CPU: a shared
// answer is made once per key for the process and every thread gets the first one stored; a
// thread's own entries are made once per key and thread, stay where they are while others are
// added, and a failed make leaves nothing behind. The GEMMs' use of them (no heuristic query and
// no descriptors on a repeated call) is checked on the GPU: tests/python/test_attention.py.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <thread>
#include <vector>

#include "kernels/common/keyed_cache.h"

namespace hfnn::kernels {
namespace {

using Key = std::array<int64_t, 2>;
struct KeyHash {
  std::size_t operator()(const Key& k) const { return static_cast<std::size_t>(k[0] * 1000003 + k[1]); }
};

// What gemm.cpp does per call: the thread's entry, made from the shared answer (made on a miss).
struct Entry {
  int answer = -1;
  int made_by = -1;
};

struct Counts {
  std::atomic<int> shared_made{0}, entries_made{0};
};

Entry* lookup(ThreadCache<Key, Entry, KeyHash>& local, SharedCache<Key, int, KeyHash>& shared, Counts& counts,
              const Key& key, int thread, int answer) {
  return local.get(key, [&](Entry& e) {
    counts.entries_made++;
    if (const auto known = shared.find(key)) {
      e.answer = *known;
    } else {
      counts.shared_made++;
      e.answer = shared.insert(key, answer);
    }
    e.made_by = thread;
    return true;
  });
}

TEST(KeyedCache, ARepeatedKeyReturnsTheSameEntryAndMakesNothing) {
  SharedCache<Key, int, KeyHash> shared;
  ThreadCache<Key, Entry, KeyHash> local;
  Counts counts;
  Entry* first = lookup(local, shared, counts, {512, 768}, 0, 7);
  ASSERT_NE(first, nullptr);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(lookup(local, shared, counts, {512, 768}, 0, 8), first);
  EXPECT_EQ(first->answer, 7);
  EXPECT_EQ(counts.shared_made.load(), 1);
  EXPECT_EQ(counts.entries_made.load(), 1);
}

TEST(KeyedCache, EntriesStayPutWhileOthersAreAdded) {
  SharedCache<Key, int, KeyHash> shared;
  ThreadCache<Key, Entry, KeyHash> local;
  Counts counts;
  Entry* first = lookup(local, shared, counts, {0, 0}, 0, 0);
  for (int64_t i = 1; i < 2000; ++i) lookup(local, shared, counts, {i, i}, 0, static_cast<int>(i));  // rehashes
  EXPECT_EQ(lookup(local, shared, counts, {0, 0}, 0, 99), first);
  EXPECT_EQ(local.size(), 2000u);
  EXPECT_EQ(shared.size(), 2000u);
  EXPECT_EQ(counts.shared_made.load(), 2000);
}

TEST(KeyedCache, EveryThreadHasItsOwnEntryAndTheFirstSharedAnswer) {
  SharedCache<Key, int, KeyHash> shared;
  Counts counts;
  constexpr int kThreads = 4;
  std::vector<Entry> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      ThreadCache<Key, Entry, KeyHash> local;  // as a thread_local would be
      for (int i = 0; i < 50; ++i) seen[t] = *lookup(local, shared, counts, {1, 2}, t, 100 + t);
      EXPECT_EQ(local.size(), 1u);
    });
  for (auto& th : threads) th.join();
  // Threads missing at once may each make an answer; all go on with the one stored first.
  EXPECT_GE(counts.shared_made.load(), 1);
  EXPECT_LE(counts.shared_made.load(), kThreads);
  EXPECT_EQ(counts.entries_made.load(), kThreads);
  EXPECT_EQ(shared.size(), 1u);
  const int stored = *shared.find({1, 2});
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(seen[t].answer, stored);
    EXPECT_EQ(seen[t].made_by, t);
  }
}

TEST(KeyedCache, AFailedMakeLeavesNoEntry) {
  ThreadCache<Key, Entry, KeyHash> local;
  int tries = 0;
  auto fail = [&](Entry&) { return ++tries > 1; };
  EXPECT_EQ(local.get({3, 4}, fail), nullptr);
  EXPECT_EQ(local.size(), 0u);
  Entry* made = local.get({3, 4}, fail);  // tried again, and kept
  EXPECT_NE(made, nullptr);
  EXPECT_EQ(local.get({3, 4}, fail), made);
  EXPECT_EQ(tries, 2);
  SharedCache<Key, int, KeyHash> shared;
  EXPECT_FALSE(shared.find({3, 4}).has_value());
  EXPECT_EQ(shared.insert({3, 4}, 1), 1);
  EXPECT_EQ(shared.insert({3, 4}, 2), 1);  // the first stored stays
}

}  // namespace
}  // namespace hfnn::kernels
