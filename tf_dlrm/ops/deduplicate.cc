// TfDlrmDeduplicate(indices [n], values [n, width]) -> (unique [U], summed [U, width], position [n]):
// the rows of a gradient given as IndexedSlices with repeated rows, made distinct. `unique` holds
// the distinct rows in order of first occurrence and `position[i]` the place of indices[i] in it
// (as tf.unique); summed[u] is the sum of the values of u's occurrences, added in their order
// starting from zero (as tf.math.unsorted_segment_sum: the same float32 additions, so the same
// bits). Why a kernel: TensorFlow 2.21's CPU unsorted_segment_sum runs several times slower than
// 2.18's, and the sparse optimizers run it on every gradient read through a plain gather. Here one
// pass finds the rows (a direct array or a hash index, id_index.h), then the threads add the
// values into their rows in order (row_blocks.h).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "id_index.h"
#include "row_blocks.h"

namespace tf_dlrm {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::InferenceContext;

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
    ForEachEntryInRowBlocks(context, count, width * static_cast<int64_t>(sizeof(float)), [&](int64_t i) { return position[i]; },
                            [&](int64_t i, int64_t u) {
                              const float* __restrict row = source + i * width;
                              float* __restrict target = summed + u * width;
                              for (int64_t j = 0; j < width; ++j) target[j] += row[j];
                            });
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
