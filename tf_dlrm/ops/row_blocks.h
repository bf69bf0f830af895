// Adding a list of entries' values into rows, each row's entries in their order, on all threads.
//
// Several of tf_dlrm's kernels add `count` entries into rows (entry i into row row_of(i)) where a
// repeated row must receive its entries in order (the same float32 operations, so the same bits,
// as TensorFlow's sequential ops). Each thread owns the rows of every units-th block of rows and
// streams through all entries in order, skipping those of other threads' rows: a row is written by
// one thread only, whole, and no cache line holds rows of two threads (a block spans at least
// kBlockBytes). Cutting by columns instead (each thread a part of every row) balances skewed ids
// better but lets the threads' prefetchers fight over the lines of the rows being written; it
// ran several times slower on two threads than on one.

#ifndef TF_DLRM_OPS_ROW_BLOCKS_H_
#define TF_DLRM_OPS_ROW_BLOCKS_H_

#include <algorithm>
#include <cstdint>
#include <limits>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tf_dlrm {

inline constexpr int64_t kBlockBytes = 512;

// Calls add(i, row) for every entry i, in increasing i for each row; row_of(i) must be >= 0.
template <typename RowOf, typename Add>
void ForEachEntryInRowBlocks(::tensorflow::OpKernelContext* context, int64_t count, int64_t row_bytes, RowOf row_of,
                             Add add) {
  auto* threads = context->device()->tensorflow_cpu_worker_threads();
  const int64_t units = std::max<int64_t>(1, std::min<int64_t>(threads->num_threads, count / 1024 + 1));
  const int64_t rows_per_block = std::max<int64_t>(1, (kBlockBytes + row_bytes - 1) / std::max<int64_t>(row_bytes, 1));
  auto work = [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      for (int64_t i = 0; i < count; ++i) {
        const int64_t row = row_of(i);
        if ((row / rows_per_block) % units == unit) add(i, row);
      }
    }
  };
  if (units == 1) {
    work(0, 1);
    return;
  }
  // One unit per thread, whatever the cost estimate (Shard would otherwise pack several units into
  // one thread's block).
  ::tensorflow::Shard(threads->num_threads, threads->workers, units, std::numeric_limits<int64_t>::max() / units, work);
}

}  // namespace tf_dlrm

#endif  // TF_DLRM_OPS_ROW_BLOCKS_H_
