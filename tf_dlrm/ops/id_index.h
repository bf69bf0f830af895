// Shared by tf_dlrm's kernels that turn a list of row ids into its distinct rows: an open-addressing
// index of ids (each distinct id's slot, in first-seen order) and a prefetch of rows read in a
// known order.

#ifndef TF_DLRM_OPS_ID_INDEX_H_
#define TF_DLRM_OPS_ID_INDEX_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace tf_dlrm {

// Rows are read in an order known ahead (ids): asking for the row kPrefetch ids ahead hides most of
// the memory latency of reading rows scattered over a table larger than the caches.
inline constexpr int64_t kPrefetch = 4;

inline void PrefetchRow(const float* row, int64_t width) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t at = 0; at < width * static_cast<int64_t>(sizeof(float)); at += 64) __builtin_prefetch(bytes + at);
}

// Open addressing over non-negative ids: the slot of each distinct id, in first-seen order.
class IdIndex {
 public:
  explicit IdIndex(int64_t expected) {
    int64_t capacity = 16;
    while (capacity < 2 * expected) capacity *= 2;
    keys_.assign(capacity, -1);
    slots_.resize(capacity);
    mask_ = capacity - 1;
  }

  // The slot of `id` (>= 0), a new one (the next free number) when first seen.
  int32_t Find(int64_t id) {
    uint64_t at = (static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> 20;
    while (true) {
      at &= mask_;
      if (keys_[at] == id) return slots_[at];
      if (keys_[at] < 0) {
        keys_[at] = id;
        slots_[at] = static_cast<int32_t>(distinct_.size());
        distinct_.push_back(id);
        return slots_[at];
      }
      ++at;
    }
  }

  const std::vector<int64_t>& distinct() const { return distinct_; }

 private:
  std::vector<int64_t> keys_;
  std::vector<int32_t> slots_;
  std::vector<int64_t> distinct_;
  uint64_t mask_ = 0;
};

// The distinct ids of a list of `count` ids in [0, largest], in first-seen order, and each id's slot
// among them. Ids no larger than a few times their count (a small table, or many lookups) use a
// direct id -> slot array, cheaper than hashing; others an IdIndex.
class DistinctIds {
 public:
  DistinctIds(int64_t largest, int64_t count) : direct_(largest < 8 * count + 4096) {
    if (direct_) {
      slot_.assign(largest + 1, -1);
    } else {
      index_.emplace(count);
    }
  }

  int32_t Find(int64_t id) {
    if (!direct_) return index_->Find(id);
    if (slot_[id] < 0) {
      slot_[id] = static_cast<int32_t>(distinct_.size());
      distinct_.push_back(id);
    }
    return slot_[id];
  }

  const std::vector<int64_t>& distinct() const { return direct_ ? distinct_ : index_->distinct(); }

 private:
  bool direct_;
  std::vector<int32_t> slot_;
  std::vector<int64_t> distinct_;
  std::optional<IdIndex> index_;
};

// Counting sort of `size` items by their slot (< distinct): (*starts)[u] .. (*starts)[u + 1] delimit
// slot u's items in `grouped`, each written as code(p), in their original order p.
template <typename Code>
void GroupBySlot(const int32_t* slot_of, int64_t size, int64_t distinct, Code code, std::vector<int64_t>* starts,
                 std::vector<int64_t>* grouped) {
  starts->assign(distinct + 1, 0);
  for (int64_t p = 0; p < size; ++p) ++(*starts)[slot_of[p] + 1];
  for (int64_t u = 0; u < distinct; ++u) (*starts)[u + 1] += (*starts)[u];
  std::vector<int64_t> fill(starts->begin(), starts->end() - 1);
  grouped->resize(size);
  for (int64_t p = 0; p < size; ++p) (*grouped)[fill[slot_of[p]]++] = code(p);
}

}  // namespace tf_dlrm

#endif  // TF_DLRM_OPS_ID_INDEX_H_
