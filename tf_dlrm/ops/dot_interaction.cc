// The dot interaction of DLRM as two CPU kernels: [bottom, pairwise dot products of the F = T + 1
// vectors (bottom-MLP output and T embeddings) of width D, (strict) lower triangle in row-major
// order] per sample, and its gradient.
//
// Why a kernel: on CPU at small D the generic path (a batched matmul of [B, F, D] by its
// transpose, then a gather of the triangle) spends most of its time moving the F x F products
// and the transposed gradient around; here each sample's products and gradient are computed in
// one pass over its F * D inputs, which stay in L1.

#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tf_dlrm {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// The inner loops work on blocks of 8 floats in GCC's portable vector type: one AVX2 register
// (two SSE registers without AVX2); plain loops were left scalar by the auto-vectoriser.
constexpr int kBlock = 8;
typedef float Block __attribute__((vector_size(kBlock * sizeof(float))));

inline Block Load(const float* from) {
  Block block;
  std::memcpy(&block, from, sizeof(Block));
  return block;
}

inline void Store(float* to, const Block& block) { std::memcpy(to, &block, sizeof(Block)); }

// Rows per tile: with two blocks per row, 2 kRows sums in flight hide the multiply-add latency.
constexpr int kRows = 4;

// A kRows x 2 kBlock block of sums in registers: 2 kRows independent multiply-add chains, which
// hide the multiply-add latency. Both kernels are sums of such rank-1 updates.
struct Tile {
  Block left[kRows], right[kRows];

  Tile() {
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) left[r] = right[r] = Block{};
  }

  // Row r += scale[r * scale_stride] * x[0 : 2 kBlock].
  inline void Add(const float* scale, int64_t scale_stride, const float* x) {
    const Block x_left = Load(x), x_right = Load(x + kBlock);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      left[r] += scale[r * scale_stride] * x_left;
      right[r] += scale[r * scale_stride] * x_right;
    }
  }

  inline void StoreTo(float* to, int64_t stride) const {
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      Store(to + r * stride, left[r]);
      Store(to + r * stride + kBlock, right[r]);
    }
  }
};

// Per-sample scratch shapes: vectors padded to whole tiles with zeros.
struct Tiling {
  Tiling(int64_t count, int64_t width)
      : padded_rows((count + kRows - 1) / kRows * kRows),
        padded_columns((count + 2 * kBlock - 1) / (2 * kBlock) * (2 * kBlock)),
        padded_width((width + 2 * kBlock - 1) / (2 * kBlock) * (2 * kBlock)) {}
  int64_t padded_rows, padded_columns, padded_width;
};

int64_t NumPairs(int64_t vectors, bool include_diagonal) {
  return include_diagonal ? vectors * (vectors + 1) / 2 : vectors * (vectors - 1) / 2;
}

// The F = T + 1 vectors of sample b: the bottom-MLP output first, then the T embeddings.
template <typename T>
struct Sample {
  const T* bottom;
  const T* embeddings;
  int64_t width;
  const T* vector(int64_t i) const { return i == 0 ? bottom : embeddings + (i - 1) * width; }
};

// Values enter the float32 scratch buffers and leave them through these two: for bfloat16 inputs
// every product and sum is computed in float32 (exact products of bf16 values, float32
// accumulation) and only the result is rounded to bfloat16, to nearest even.
inline float ToFloat(float x) { return x; }
inline float ToFloat(::tensorflow::bfloat16 x) { return static_cast<float>(x); }
template <typename T>
inline T FromFloat(float x) { return static_cast<T>(x); }

template <typename T>
inline void CopyOut(T* to, const float* from, int64_t n) {
  for (int64_t k = 0; k < n; ++k) to[k] = FromFloat<T>(from[k]);
}
template <>
inline void CopyOut<float>(float* to, const float* from, int64_t n) { std::memcpy(to, from, sizeof(float) * n); }

template <typename T>
inline void CopyIn(float* to, const T* from, int64_t n) {
  for (int64_t k = 0; k < n; ++k) to[k] = ToFloat(from[k]);
}
template <>
inline void CopyIn<float>(float* to, const float* from, int64_t n) { std::memcpy(to, from, sizeof(float) * n); }

// What both kernels share: the include_diagonal attribute and the checked input shapes.
class InteractionKernel : public OpKernel {
 public:
  explicit InteractionKernel(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("include_diagonal", &include_diagonal_));
  }

 protected:
  struct Shapes {
    int64_t batch, width, count, pairs, row;  // count = T + 1 vectors; row = width + pairs
  };

  // False (with the error set on the context) unless bottom is [batch, D] and embeddings [batch, T, D].
  bool ReadShapes(OpKernelContext* context, const Tensor& bottom, const Tensor& embeddings, Shapes* shapes) const {
    if (!(bottom.dims() == 2 && embeddings.dims() == 3 && bottom.dim_size(0) == embeddings.dim_size(0) &&
          bottom.dim_size(1) == embeddings.dim_size(2))) {
      context->SetStatus(InvalidArgument("expected bottom [batch, D] and embeddings [batch, T, D]; got shapes ",
                                         bottom.shape().DebugString(), " and ", embeddings.shape().DebugString()));
      return false;
    }
    shapes->batch = bottom.dim_size(0);
    shapes->width = bottom.dim_size(1);
    shapes->count = embeddings.dim_size(1) + 1;
    shapes->pairs = NumPairs(shapes->count, include_diagonal_);
    shapes->row = shapes->width + shapes->pairs;
    return true;
  }

  bool include_diagonal_;
};

// out[b] = [bottom[b], z_10, z_20, z_21, ...] with z_ij = x_i . x_j for j < i (j <= i with the
// diagonal). Per sample the vectors are transposed into [D, F] so that the products of x_i with
// every x_j are one vectorised multiply-add per coordinate, in a fixed order.
template <typename T>
class DotInteractionOp : public InteractionKernel {
 public:
  using InteractionKernel::InteractionKernel;

  void Compute(OpKernelContext* context) override {
    const Tensor& bottom = context->input(0);
    const Tensor& embeddings = context->input(1);
    Shapes shapes;
    if (!ReadShapes(context, bottom, embeddings, &shapes)) return;
    const int64_t batch = shapes.batch, width = shapes.width, count = shapes.count, pairs = shapes.pairs, row = shapes.row;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({batch, row}), &output));
    const T* bottom_data = bottom.flat<T>().data();
    const T* embedding_data = embeddings.flat<T>().data();
    T* out = output->flat<T>().data();
    const bool diagonal = include_diagonal_;
    auto work = [=](int64_t begin, int64_t end) {
      const Tiling tiling(count, width);
      std::vector<float> transposed_buffer(tiling.padded_width * tiling.padded_columns, 0.0f);
      std::vector<float> gram_buffer(tiling.padded_rows * tiling.padded_columns);
      float* __restrict__ transposed = transposed_buffer.data();
      float* __restrict__ gram = gram_buffer.data();
      for (int64_t b = begin; b < end; ++b) {
        const Sample<T> sample{bottom_data + b * width, embedding_data + b * (count - 1) * width, width};
        for (int64_t k = 0; k < width; ++k) {
          float* __restrict__ column = transposed + k * tiling.padded_columns;
          column[0] = ToFloat(sample.bottom[k]);
          const T* x = sample.embeddings + k;
          for (int64_t j = 1; j < count; ++j) column[j] = ToFloat(x[(j - 1) * width]);
        }
        // Tiles of kRows x 2 kBlock products on or below the diagonal: 2 kRows independent sums.
        for (int64_t i0 = 0; i0 < count; i0 += kRows) {
          for (int64_t j0 = 0; j0 <= i0 + kRows - 1 && j0 < count; j0 += 2 * kBlock) {
            Tile tile;
            for (int64_t k = 0; k < width; ++k) {
              const float* column = transposed + k * tiling.padded_columns;
              tile.Add(column + i0, 1, column + j0);
            }
            tile.StoreTo(gram + i0 * tiling.padded_columns + j0, tiling.padded_columns);
          }
        }
        T* __restrict__ y = out + b * row;
        std::memcpy(y, sample.bottom, sizeof(T) * width);
        y += width;
        for (int64_t i = 0; i < count; ++i) {
          const int64_t n = diagonal ? i + 1 : i;
          CopyOut<T>(y, gram + i * tiling.padded_columns, n);
          y += n;
        }
      }
    };
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(threads->num_threads, threads->workers, batch, 2 * pairs * width, work);
  }
};

// With S the symmetric F x F matrix of the upstream gradient at the pairs (S_ij = S_ji = g_ij,
// S_ii = 2 g_ii when the diagonal is kept, else 0): dx_i = sum_j S_ij x_j. The bottom vector also
// receives the upstream gradient of its copy at the front of the output.
template <typename T>
class DotInteractionGradOp : public InteractionKernel {
 public:
  using InteractionKernel::InteractionKernel;

  void Compute(OpKernelContext* context) override {
    const Tensor& bottom = context->input(0);
    const Tensor& embeddings = context->input(1);
    const Tensor& upstream = context->input(2);
    Shapes shapes;
    if (!ReadShapes(context, bottom, embeddings, &shapes)) return;
    const int64_t batch = shapes.batch, width = shapes.width, count = shapes.count, row = shapes.row;
    OP_REQUIRES(context, upstream.dims() == 2 && upstream.dim_size(0) == batch && upstream.dim_size(1) == row,
                InvalidArgument("upstream must be [", batch, ", ", row, "]; got shape ", upstream.shape().DebugString()));
    Tensor* bottom_gradient = nullptr;
    Tensor* embedding_gradient = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, bottom.shape(), &bottom_gradient));
    OP_REQUIRES_OK(context, context->allocate_output(1, embeddings.shape(), &embedding_gradient));
    const T* bottom_data = bottom.flat<T>().data();
    const T* embedding_data = embeddings.flat<T>().data();
    const T* upstream_data = upstream.flat<T>().data();
    T* bottom_out = bottom_gradient->flat<T>().data();
    T* embedding_out = embedding_gradient->flat<T>().data();
    const bool diagonal = include_diagonal_;
    auto work = [=](int64_t begin, int64_t end) {
      const Tiling tiling(count, width);
      std::vector<float> symmetric_buffer(tiling.padded_rows * count, 0.0f);
      std::vector<float> vectors_buffer(count * tiling.padded_width, 0.0f);
      std::vector<float> gradient_buffer(tiling.padded_rows * tiling.padded_width);
      float* __restrict__ symmetric = symmetric_buffer.data();
      float* __restrict__ vectors = vectors_buffer.data();
      float* __restrict__ gradient = gradient_buffer.data();
      for (int64_t b = begin; b < end; ++b) {
        const Sample<T> sample{bottom_data + b * width, embedding_data + b * (count - 1) * width, width};
        const T* g = upstream_data + b * row;
        const T* pair = g + width;
        for (int64_t i = 0; i < count; ++i) {
          for (int64_t j = 0; j < i; ++j) symmetric[i * count + j] = symmetric[j * count + i] = ToFloat(*pair++);
          symmetric[i * count + i] = diagonal ? 2.0f * ToFloat(*pair++) : 0.0f;
          CopyIn<T>(vectors + i * tiling.padded_width, sample.vector(i), width);
        }
        // Tiles of kRows x 2 kBlock of dX = S X: 2 kRows independent sums.
        for (int64_t i0 = 0; i0 < count; i0 += kRows) {
          for (int64_t k0 = 0; k0 < width; k0 += 2 * kBlock) {
            Tile tile;
            for (int64_t j = 0; j < count; ++j) {
              tile.Add(symmetric + i0 * count + j, count, vectors + j * tiling.padded_width + k0);
            }
            tile.StoreTo(gradient + i0 * tiling.padded_width + k0, tiling.padded_width);
          }
        }
        T* __restrict__ bottom_row = bottom_out + b * width;
        for (int64_t k = 0; k < width; ++k) bottom_row[k] = FromFloat<T>(ToFloat(g[k]) + gradient[k]);
        for (int64_t i = 1; i < count; ++i) {
          CopyOut<T>(embedding_out + (b * (count - 1) + i - 1) * width, gradient + i * tiling.padded_width, width);
        }
      }
    };
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(threads->num_threads, threads->workers, batch, 2 * count * count * width, work);
  }
};

::tensorflow::Status InteractionShape(InferenceContext* c) {
  ShapeHandle bottom, embeddings;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &bottom));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &embeddings));
  bool include_diagonal;
  TF_RETURN_IF_ERROR(c->GetAttr("include_diagonal", &include_diagonal));
  DimensionHandle tables = c->Dim(embeddings, 1), width = c->Dim(bottom, 1);
  DimensionHandle row = c->UnknownDim();
  if (c->ValueKnown(tables) && c->ValueKnown(width)) {
    row = c->MakeDim(c->Value(width) + NumPairs(c->Value(tables) + 1, include_diagonal));
  }
  c->set_output(0, c->Matrix(c->Dim(bottom, 0), row));
  return ::tensorflow::OkStatus();
}

}  // namespace

// T = bfloat16 (mixed precision): the inputs are widened to float32, products and sums are float32,
// the outputs are rounded to bfloat16 once.
REGISTER_OP("TfDlrmDotInteraction")
    .Input("bottom: T")
    .Input("embeddings: T")
    .Output("interactions: T")
    .Attr("T: {float, bfloat16} = DT_FLOAT")
    .Attr("include_diagonal: bool = false")
    .SetShapeFn(InteractionShape);

REGISTER_OP("TfDlrmDotInteractionGrad")
    .Input("bottom: T")
    .Input("embeddings: T")
    .Input("upstream: T")
    .Output("bottom_gradient: T")
    .Output("embedding_gradient: T")
    .Attr("T: {float, bfloat16} = DT_FLOAT")
    .Attr("include_diagonal: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(1));
      return ::tensorflow::OkStatus();
    });

#define TF_DLRM_REGISTER(type)                                                                              \
  REGISTER_KERNEL_BUILDER(Name("TfDlrmDotInteraction").Device(::tensorflow::DEVICE_CPU).TypeConstraint<type>("T"), \
                          DotInteractionOp<type>);                                                           \
  REGISTER_KERNEL_BUILDER(                                                                                   \
      Name("TfDlrmDotInteractionGrad").Device(::tensorflow::DEVICE_CPU).TypeConstraint<type>("T"),           \
      DotInteractionGradOp<type>);
TF_DLRM_REGISTER(float)
TF_DLRM_REGISTER(::tensorflow::bfloat16)
#undef TF_DLRM_REGISTER

}  // namespace tf_dlrm
