// Assembles a [b, W] block from column runs of several "parts" in one pass, and its gradient.
//
// Why a kernel: after the embedding alltoall a rank holds what every source sent (one flat tensor:
// source s's [b, W_s] block after source s-1's) and its replicated tables' [b, R] lookups; DLRM
// wants them side by side in feature order. Plain TensorFlow does that as split + concat (the
// received sources side by side), concat (with the replicated part) and a column gather (feature
// order): three copies of the rows forward, four backward. Here each output row is written once
// from where its columns lie, and the gradient is written once into tensors shaped like the parts.
//
// Layout. Part p (rank 1 or 2) is a stack of chunks along the rows: chunk c of width w_c holds
// [b, w_c] row-major, after the chunks before it in the part (a rank-2 [b, W] part is one chunk).
// A run (chunk, first column, length) copies that many columns of the chunk; the output is the
// runs side by side, in order. A chunk column read by no run (padding) gets a zero gradient; a
// column read twice is refused when the op is built (its gradient would be a sum).

#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tf_dlrm {
namespace {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::InferenceContext;

struct Run {
  int64_t part, chunk_start_column, column, length, output_column;  // chunk_start_column: sum of earlier chunks' widths
  int64_t chunk_width;
};

// The attributes of both ops, checked once: the chunks of every part and the runs.
class Layout {
 public:
  ::tensorflow::Status Read(OpKernelConstruction* context) {
    std::vector<int64_t> chunk_widths, chunks_per_part, run_chunks, run_columns, run_lengths;
    TF_RETURN_IF_ERROR(context->GetAttr("chunk_widths", &chunk_widths));
    TF_RETURN_IF_ERROR(context->GetAttr("chunks_per_part", &chunks_per_part));
    TF_RETURN_IF_ERROR(context->GetAttr("run_chunks", &run_chunks));
    TF_RETURN_IF_ERROR(context->GetAttr("run_columns", &run_columns));
    TF_RETURN_IF_ERROR(context->GetAttr("run_lengths", &run_lengths));
    int64_t total_chunks = 0;
    for (int64_t count : chunks_per_part) {
      if (count < 1) return InvalidArgument("every part needs at least one chunk; got chunks_per_part with ", count);
      total_chunks += count;
    }
    if (total_chunks != static_cast<int64_t>(chunk_widths.size())) {
      return InvalidArgument("chunks_per_part adds up to ", total_chunks, " chunks but chunk_widths has ",
                             chunk_widths.size());
    }
    if (run_chunks.size() != run_columns.size() || run_chunks.size() != run_lengths.size()) {
      return InvalidArgument("run_chunks, run_columns and run_lengths differ in length: ", run_chunks.size(), ", ",
                             run_columns.size(), ", ", run_lengths.size());
    }
    std::vector<int64_t> part_of_chunk, start_of_chunk;
    for (size_t p = 0; p < chunks_per_part.size(); ++p) {
      int64_t start = 0;
      for (int64_t k = 0; k < chunks_per_part[p]; ++k) {
        const int64_t width = chunk_widths[part_of_chunk.size()];
        if (width < 0) return InvalidArgument("chunk widths must be >= 0; got ", width);
        part_of_chunk.push_back(p);
        start_of_chunk.push_back(start);
        start += width;
      }
      if (start < 1) return InvalidArgument("part ", p, " has no column");
      part_widths_.push_back(start);
    }
    std::vector<std::vector<bool>> read(chunk_widths.size());
    for (size_t c = 0; c < chunk_widths.size(); ++c) read[c].assign(chunk_widths[c], false);
    int64_t output = 0;
    for (size_t r = 0; r < run_chunks.size(); ++r) {
      const int64_t chunk = run_chunks[r], column = run_columns[r], length = run_lengths[r];
      if (chunk < 0 || chunk >= total_chunks) return InvalidArgument("run ", r, " names chunk ", chunk, " of ", total_chunks);
      if (length < 1 || column < 0 || column + length > chunk_widths[chunk]) {
        return InvalidArgument("run ", r, " reads columns [", column, ", ", column + length, ") of chunk ", chunk,
                               ", which has ", chunk_widths[chunk]);
      }
      for (int64_t k = column; k < column + length; ++k) {
        if (read[chunk][k]) return InvalidArgument("column ", k, " of chunk ", chunk, " is read by more than one run");
        read[chunk][k] = true;
      }
      runs_.push_back(Run{part_of_chunk[chunk], start_of_chunk[chunk], column, length, output, chunk_widths[chunk]});
      output += length;
    }
    output_width_ = output;
    // Columns no run reads, as (part, chunk start column, column, length, -, chunk width) runs to zero.
    for (size_t c = 0; c < chunk_widths.size(); ++c) {
      for (int64_t k = 0; k < chunk_widths[c];) {
        if (read[c][k]) {
          ++k;
          continue;
        }
        int64_t end = k;
        while (end < chunk_widths[c] && !read[c][end]) ++end;
        unread_.push_back(Run{part_of_chunk[c], start_of_chunk[c], k, end - k, -1, chunk_widths[c]});
        k = end;
      }
    }
    return ::tensorflow::OkStatus();
  }

  const std::vector<Run>& runs() const { return runs_; }
  const std::vector<Run>& unread() const { return unread_; }
  const std::vector<int64_t>& part_widths() const { return part_widths_; }
  int64_t output_width() const { return output_width_; }

 private:
  std::vector<Run> runs_, unread_;
  std::vector<int64_t> part_widths_;
  int64_t output_width_ = 0;
};

// Where row i of a run's chunk starts in its part: chunk at b * (its start column), rows of chunk_width.
inline int64_t RowStart(const Run& run, int64_t batch, int64_t row) {
  return batch * run.chunk_start_column + row * run.chunk_width + run.column;
}

template <typename T>
class AssembleColumnsOp : public OpKernel {
 public:
  explicit AssembleColumnsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, layout_.Read(context));
    OP_REQUIRES(context, static_cast<int64_t>(layout_.part_widths().size()) == context->num_inputs(),
                InvalidArgument("chunks_per_part describes ", layout_.part_widths().size(), " parts; the op has ",
                                context->num_inputs(), " inputs"));
  }

  void Compute(OpKernelContext* context) override {
    OpInputList parts;
    OP_REQUIRES_OK(context, context->input_list("parts", &parts));
    const int64_t batch = parts[0].NumElements() / layout_.part_widths()[0];
    std::vector<const T*> from(parts.size());
    for (int p = 0; p < parts.size(); ++p) {
      const Tensor& part = parts[p];
      const int64_t width = layout_.part_widths()[p];
      OP_REQUIRES(context, (part.dims() == 1 || (part.dims() == 2 && part.dim_size(1) == width)) &&
                               part.NumElements() == batch * width,
                  InvalidArgument("part ", p, " should hold ", batch, " rows of ", width, " columns (", batch * width,
                                  " values, shape [", batch * width, "] or [", batch, ", ", width, "]); got shape ",
                                  part.shape().DebugString()));
      from[p] = part.flat<T>().data();
    }
    Tensor* assembled = nullptr;
    const int64_t width = layout_.output_width();
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({batch, width}), &assembled));
    T* to = assembled->flat<T>().data();
    const std::vector<Run>& runs = layout_.runs();
    auto work = [&](int64_t first, int64_t last) {
      for (int64_t row = first; row < last; ++row) {
        T* out = to + row * width;
        for (const Run& run : runs) {
          std::memcpy(out + run.output_column, from[run.part] + RowStart(run, batch, row), sizeof(T) * run.length);
        }
      }
    };
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(threads->num_threads, threads->workers, batch, 2 * width * sizeof(T), work);
  }

 private:
  Layout layout_;
};

template <typename T>
class AssembleColumnsGradOp : public OpKernel {
 public:
  explicit AssembleColumnsGradOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, layout_.Read(context));
    OP_REQUIRES_OK(context, context->GetAttr("part_ranks", &part_ranks_));
    OP_REQUIRES(context, part_ranks_.size() == layout_.part_widths().size(),
                InvalidArgument("part_ranks has ", part_ranks_.size(), " entries for ", layout_.part_widths().size(),
                                " parts"));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& gradient = context->input(0);
    OP_REQUIRES(context, gradient.dims() == 2 && gradient.dim_size(1) == layout_.output_width(),
                InvalidArgument("expected the gradient as [batch, ", layout_.output_width(), "]; got shape ",
                                gradient.shape().DebugString()));
    const int64_t batch = gradient.dim_size(0), width = layout_.output_width();
    OpOutputList parts;
    OP_REQUIRES_OK(context, context->output_list("parts", &parts));
    std::vector<T*> to(part_ranks_.size());
    for (size_t p = 0; p < part_ranks_.size(); ++p) {
      const int64_t part_width = layout_.part_widths()[p];
      TensorShape shape = part_ranks_[p] == 1 ? TensorShape({batch * part_width}) : TensorShape({batch, part_width});
      Tensor* part = nullptr;
      OP_REQUIRES_OK(context, parts.allocate(p, shape, &part));
      to[p] = part->flat<T>().data();
    }
    const T* from = gradient.flat<T>().data();
    const std::vector<Run>& runs = layout_.runs();
    const std::vector<Run>& unread = layout_.unread();
    auto work = [&](int64_t first, int64_t last) {
      for (int64_t row = first; row < last; ++row) {
        const T* in = from + row * width;
        for (const Run& run : runs) {
          std::memcpy(to[run.part] + RowStart(run, batch, row), in + run.output_column, sizeof(T) * run.length);
        }
        for (const Run& run : unread) std::memset(to[run.part] + RowStart(run, batch, row), 0, sizeof(T) * run.length);
      }
    };
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(threads->num_threads, threads->workers, batch, 2 * width * sizeof(T), work);
  }

 private:
  Layout layout_;
  std::vector<int32_t> part_ranks_;
};

::tensorflow::Status AssembleShape(InferenceContext* c) {
  std::vector<int64_t> lengths;
  TF_RETURN_IF_ERROR(c->GetAttr("run_lengths", &lengths));
  int64_t width = 0;
  for (int64_t length : lengths) width += length;
  c->set_output(0, c->Matrix(c->UnknownDim(), width));
  return ::tensorflow::OkStatus();
}

}  // namespace

// The layout attributes both ops read (class Layout).
#define TF_DLRM_LAYOUT_ATTRS                \
  Attr("N: int >= 1")                       \
      .Attr("T: {float, bfloat16, half}")   \
      .Attr("chunk_widths: list(int)")      \
      .Attr("chunks_per_part: list(int)")   \
      .Attr("run_chunks: list(int)")        \
      .Attr("run_columns: list(int)")       \
      .Attr("run_lengths: list(int)")

REGISTER_OP("TfDlrmAssembleColumns")
    .Input("parts: N * T")
    .Output("assembled: T")
    .TF_DLRM_LAYOUT_ATTRS
    .SetShapeFn(AssembleShape);

REGISTER_OP("TfDlrmAssembleColumnsGrad")
    .Input("gradient: T")
    .Output("parts: N * T")
    .TF_DLRM_LAYOUT_ATTRS
    .Attr("part_ranks: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      int parts;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &parts));
      std::vector<int32_t> ranks;
      TF_RETURN_IF_ERROR(c->GetAttr("part_ranks", &ranks));
      for (int p = 0; p < parts; ++p) {
        c->set_output(p, p < static_cast<int>(ranks.size()) && ranks[p] == 2 ? c->Matrix(c->UnknownDim(), c->UnknownDim())
                                                                               : c->Vector(c->UnknownDim()));
      }
      return ::tensorflow::OkStatus();
    });

#define TF_DLRM_REGISTER(type)                                                                                   \
  REGISTER_KERNEL_BUILDER(Name("TfDlrmAssembleColumns").Device(::tensorflow::DEVICE_CPU).TypeConstraint<type>("T"), \
                          AssembleColumnsOp<type>);                                                              \
  REGISTER_KERNEL_BUILDER(                                                                                       \
      Name("TfDlrmAssembleColumnsGrad").Device(::tensorflow::DEVICE_CPU).TypeConstraint<type>("T"),              \
      AssembleColumnsGradOp<type>);
TF_DLRM_REGISTER(float)
TF_DLRM_REGISTER(::tensorflow::bfloat16)
TF_DLRM_REGISTER(Eigen::half)
#undef TF_DLRM_REGISTER
#undef TF_DLRM_LAYOUT_ATTRS

}  // namespace tf_dlrm
