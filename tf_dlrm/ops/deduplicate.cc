// TfDlrmDeduplicate(indices [n], values [n, width]) -> (unique [U], summed [U, width], position [n]):
// the rows of a gradient given as IndexedSlices with repeated rows, made distinct. `unique` holds
// the distinct rows in order of first occurrence and `position[i]` the place of indices[i] in it
// (as tf.unique); summed[u] is the sum of the values of u's occurrences, added in their order
// starting from zero (as tf.math.unsorted_segment_sum: the same float32 additions, so the same
// bits). Why a kernel: TensorFlow 2.21's CPU unsorted_segment_sum runs several times slower than
// 2.18's, and the sparse optimizers run it on every gradient read through a plain gather. Here one
// pass finds the rows (a direct array or a hash index, id_index.h), then the threads add the
// values into their rows, each thread its own columns.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "id_index.h"

namespace tf_dlrm {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::InferenceContext;

// One cache line of float32 columns.
constexpr int64_t kColumnsPerChunk = 16;

template <typename Index>
class DeduplicateOp : public OpKernel {
 public:
  explicit DeduplicateOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& indices = context->input(0);
    const Tensor& values = context->input(1);
    OP_REQUIRES(context, indices.dims() == 1 && values.dims() == 2 && values.dim_size(0) == indices.dim_size(0),
                InvalidArgument("Expected indices [n] and values [n, width]. Received: ", indices.shape().DebugString(),
                                " and ", values.shape().DebugString()));
    const int64_t count = indices.dim_size(0), width = values.dim_size(1);
    const Index* ids = indices.flat<Index>().data();
    int64_t largest = -1;
    for (int64_t i = 0; i < count; ++i) {
      OP_REQUIRES(context, ids[i] >= 0, InvalidArgument("Expected non-negative rows. Received: ", ids[i], " at ", i));
      largest = std::max<int64_t>(largest, ids[i]);
    }
    Tensor* position_tensor = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({count}), &position_tensor));
    int32_t* position = position_tensor->flat<int32_t>().data();
    DistinctIds rows(largest, count);
    for (int64_t i = 0; i < count; ++i) position[i] = rows.Find(ids[i]);
    const std::vector<int64_t>& distinct = rows.distinct();
    const int64_t unique_count = static_cast<int64_t>(distinct.size());

    Tensor* unique_tensor = nullptr;
    Tensor* summed_tensor = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({unique_count}), &unique_tensor));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({unique_count, width}), &summed_tensor));
    Index* unique = unique_tensor->flat<Index>().data();
    for (int64_t u = 0; u < unique_count; ++u) unique[u] = static_cast<Index>(distinct[u]);
    const float* source = values.flat<float>().data();
    float* summed = summed_tensor->flat<float>().data();
    std::fill(summed, summed + unique_count * width, 0.0f);
    // Work is cut by columns first: every thread streams through the values in order, adding its
    // columns of each entry into its row, whatever the skew of the ids (a hot row's many entries are
    // shared out, not left to one thread). Many threads also cut the rows into ranges, each range's
    // thread skipping the entries of other rows.
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    const int64_t chunks = (width + kColumnsPerChunk - 1) / kColumnsPerChunk;
    const int64_t ranges = std::max<int64_t>(1, (2 * threads->num_threads + chunks - 1) / std::max<int64_t>(chunks, 1));
    const int64_t rows_per_range = (unique_count + ranges - 1) / ranges;
    auto work = [&](int64_t begin, int64_t end) {
      while (begin < end) {
        const int64_t range = begin / chunks;
        const int64_t last = std::min(end, (range + 1) * chunks);  // this range's units in [begin, end)
        const int64_t first_column = (begin % chunks) * kColumnsPerChunk;
        const int64_t end_column = std::min(width, (last - range * chunks) * kColumnsPerChunk);
        const int64_t first_row = range * rows_per_range, end_row = std::min(unique_count, first_row + rows_per_range);
        for (int64_t i = 0; i < count; ++i) {
          const int64_t u = position[i];
          if (u < first_row || u >= end_row) continue;
          const float* __restrict row = source + i * width;
          float* __restrict target = summed + u * width;
          for (int64_t j = first_column; j < end_column; ++j) target[j] += row[j];
        }
        begin = last;
      }
    };
    const int64_t cost = count * std::min<int64_t>(width, kColumnsPerChunk) / ranges + 1;
    ::tensorflow::Shard(threads->num_threads, threads->workers, ranges * chunks, cost, work);
  }
};

REGISTER_OP("TfDlrmDeduplicate")
    .Input("indices: Tindices")
    .Input("values: float")
    .Output("unique: Tindices")
    .Output("summed: float")
    .Output("position: int32")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, c->Dim(c->input(1), 1)));
      c->set_output(2, c->Vector(c->Dim(c->input(0), 0)));
      return ::tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("TfDlrmDeduplicate").Device(::tensorflow::DEVICE_CPU).TypeConstraint<int32_t>("Tindices"),
                        DeduplicateOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("TfDlrmDeduplicate").Device(::tensorflow::DEVICE_CPU).TypeConstraint<int64_t>("Tindices"),
                        DeduplicateOp<int64_t>);

}  // namespace
}  // namespace tf_dlrm
