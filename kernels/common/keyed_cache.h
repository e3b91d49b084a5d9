// Host-side state made once per key and reused on every later call with that key: an answer
// shared by every thread (SharedCache) and state each thread keeps of its own (ThreadCache).
// Torch- and CUDA-free, so the C++ tests check them on any machine; kernels/common/gemm.cpp keeps
// cuBLASLt's heuristic answers in a SharedCache and its descriptors in a thread_local ThreadCache.
#pragma once
#include <cstddef>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

namespace hfnn::kernels {

// One value per key for the process. The mutex is held only to look up and to insert, never while
// a value is made (a cuBLASLt heuristic query takes tens of microseconds), so two threads missing
// the same key at once may both make one: insert() keeps the first and returns it, so every thread
// goes on with the same answer.
template <class Key, class Value, class Hash>
class SharedCache {
 public:
  std::optional<Value> find(const Key& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  Value insert(const Key& key, Value value) {
    std::lock_guard<std::mutex> lock(mutex_);
    return map_.emplace(key, std::move(value)).first->second;
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return map_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<Key, Value, Hash> map_;
};

// One value per key for one thread: no lock, so it must be used by one thread only (declare it
// thread_local). Entries never move (std::unordered_map's nodes are stable), so the pointer get()
// returns stays valid for the thread's life.
template <class Key, class Value, class Hash>
class ThreadCache {
 public:
  // The entry for key; on the first call for it, a default-constructed Value that init(Value&)
  // fills. init returning false leaves no entry (and get returns nullptr): the next call tries again.
  template <class Init>
  Value* get(const Key& key, Init&& init) {
    if (const auto it = map_.find(key); it != map_.end()) return &it->second;
    const auto it = map_.try_emplace(key).first;
    if (!init(it->second)) {
      map_.erase(it);
      return nullptr;
    }
    return &it->second;
  }
  std::size_t size() const { return map_.size(); }

 private:
  std::unordered_map<Key, Value, Hash> map_;
};

}  // namespace hfnn::kernels
