// The pooled ("bag") lookup of several features in one fused embedding variable, its gradient,
// and a multi-threaded sparse SGD update for gradients whose rows are distinct.
//
// TfDlrmEmbeddingBag(table, values[E], row_splits[E]) -> [n, E * width]: entry e's sample s is
//   combiner_e(sum of table[offsets[e] + values[e][k]] for k in [row_splits[e][s], row_splits[e][s + 1]))
// (sum; mean divides by max(count, 1); sqrtn by sqrt(max(count, 1)): an empty sample pools to 0),
// written straight into the entry's columns. Why a kernel: TensorFlow's path (unique, gather of
// the distinct rows into a new tensor, sparse segment sum, scale, concat of the entries) moves every
// gathered row through memory three times; here each sample's rows are summed in registers and
// read once, one thread per block of samples, and the table is read under the variable's shared
// lock without copying it (a ReadVariableOp of a variable updated by scatters copies it whole).
//
// TfDlrmEmbeddingBagGrad(gradient [n, E * width], values, row_splits) -> (rows [U], summed [U, width]):
// the gradient with respect to the table as one IndexedSlices over the distinct fused rows, each
// row's gradient summed over all its occurrences (within a sample, across the batch, and across
// entries reading the same table slice, i.e. the same offset). One hash pass per table slice finds
// the distinct rows (in order of first occurrence) and their occurrences; then one thread per block
// of rows sums its rows' upstream gradients. The sparse optimizers then touch each row once.
//
// TfDlrmSparseApplySgd(table, rows, gradient, learning_rate): table[rows[u]] -= rate * gradient[u],
// multi-threaded over u when the rows are distinct (as TfDlrmEmbeddingBagGrad's are); with
// distinct_rows=false, repeated rows get their entries in order, the threads sharing out blocks of rows.
// The gradient may be bfloat16 (widened exactly to float32 before the product).
//
// TfDlrmGatherRows(table, indices [n]) -> [n, width] of T: table[indices[i]] as T (bfloat16 rounded to
// nearest even, as a Cast does). Under mixed precision the rows leave the float32 table straight in
// the compute dtype, and their gradient comes back as bfloat16 IndexedSlices that TfDlrmSparseApplySgd
// takes as they are: no float32 copy of the rows is written and read again, either way.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "id_index.h"
#include "row_blocks.h"

namespace tf_dlrm {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::Var;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

enum class Combiner { kSum, kMean, kSqrtn };

::tensorflow::Status ParseCombiners(const std::vector<std::string>& names, std::vector<Combiner>* out) {
  for (const auto& name : names) {
    if (name == "sum") {
      out->push_back(Combiner::kSum);
    } else if (name == "mean") {
      out->push_back(Combiner::kMean);
    } else if (name == "sqrtn") {
      out->push_back(Combiner::kSqrtn);
    } else {
      return InvalidArgument("Expected combiners in {sum, mean, sqrtn}. Received: ", name);
    }
  }
  return ::tensorflow::OkStatus();
}

inline float Scale(Combiner combiner, int64_t count) {
  if (combiner == Combiner::kSum) return 1.0f;
  const float safe = static_cast<float>(count > 1 ? count : 1);
  return combiner == Combiner::kMean ? 1.0f / safe : 1.0f / std::sqrt(safe);
}

// The entries' ids and row splits, checked, as plain pointers (ids widened to int64 on read).
template <typename Index, typename Split>
struct Entries {
  std::vector<const Index*> values;
  std::vector<int64_t> sizes;
  std::vector<const Split*> splits;
  int64_t batch = 0;

  ::tensorflow::Status Read(OpKernelContext* context, int count) {
    OpInputList value_list, split_list;
    TF_RETURN_IF_ERROR(context->input_list("values", &value_list));
    TF_RETURN_IF_ERROR(context->input_list("row_splits", &split_list));
    for (int e = 0; e < count; ++e) {
      const Tensor& ids = value_list[e];
      const Tensor& splits_tensor = split_list[e];
      if (ids.dims() != 1 || splits_tensor.dims() != 1 || splits_tensor.NumElements() < 1) {
        return InvalidArgument("entry ", e, ": expected 1-D values and non-empty 1-D row_splits. Received: ",
                               ids.shape().DebugString(), ", ", splits_tensor.shape().DebugString());
      }
      const int64_t rows = splits_tensor.NumElements() - 1;
      if (e == 0) batch = rows;
      if (rows != batch) {
        return InvalidArgument("entry ", e, " has ", rows, " samples; entry 0 has ", batch, " (one batch for all)");
      }
      const Split* split = splits_tensor.flat<Split>().data();
      const int64_t size = ids.NumElements();
      if (split[0] != 0 || split[rows] != size) {
        return InvalidArgument("entry ", e, ": row_splits must start at 0 and end at the number of values (", size,
                               "). Received: ", static_cast<int64_t>(split[0]), " ... ", static_cast<int64_t>(split[rows]));
      }
      for (int64_t s = 0; s < rows; ++s) {
        if (split[s + 1] < split[s]) return InvalidArgument("entry ", e, ": row_splits decrease at sample ", s);
      }
      values.push_back(ids.flat<Index>().data());
      sizes.push_back(size);
      splits.push_back(split);
    }
    return ::tensorflow::OkStatus();
  }
};

// What the error messages call entry e: its feature's name when the caller gave names.
std::string EntryName(const std::vector<std::string>& names, int entry) {
  if (entry < static_cast<int>(names.size())) return "feature '" + names[entry] + "'";
  return "entry " + std::to_string(entry);
}

// Entry e's ids must lie in [0, limit) (its table's rows), and its samples hold at most `hotness`
// ids (0: unchecked): checked before any row is read, so bad input fails by name, never reads
// outside the variable.
template <typename Index, typename Split>
::tensorflow::Status CheckEntry(const Index* ids, const Split* split, int64_t batch, int64_t size, int64_t limit,
                                int64_t hotness, const std::string& name) {
  const uint64_t bound = static_cast<uint64_t>(limit);
  for (int64_t k = 0; k < size; ++k) {
    if (static_cast<uint64_t>(static_cast<int64_t>(ids[k])) >= bound) {
      return InvalidArgument(name, ": an id is outside [0, ", limit, ") (id ", static_cast<int64_t>(ids[k]),
                             " at position ", k, "; there are no pad ids: every id must be >= 0 and < the table's rows)");
    }
  }
  if (hotness > 0) {
    for (int64_t s = 0; s < batch; ++s) {
      if (split[s + 1] - split[s] > hotness) {
        return InvalidArgument(name, ": a sample has more ids than its hotness ", hotness, " (sample ", s, " has ",
                               static_cast<int64_t>(split[s + 1] - split[s]), ")");
      }
    }
  }
  return ::tensorflow::OkStatus();
}

// Looks up resource input `index`, which must be a float32 [rows, width] variable (the caller locks it).
::tensorflow::Status LookupTable(OpKernelContext* context, int index, ::tensorflow::core::RefCountPtr<Var>* variable) {
  TF_RETURN_IF_ERROR(::tensorflow::LookupResource(context, ::tensorflow::HandleFromInput(context, index), variable));
  const Tensor* table = (*variable)->tensor();
  if (table->dtype() != ::tensorflow::DT_FLOAT || table->dims() != 2) {
    return InvalidArgument("expected a float32 [rows, width] variable. Received: ",
                           ::tensorflow::DataTypeString(table->dtype()), " ", table->shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// Which table each entry reads, at which row offset, pooled how, into which output columns.
class BagAttributes {
 public:
  explicit BagAttributes(OpKernelConstruction* context) {
    std::vector<std::string> names;
    OP_REQUIRES_OK(context, context->GetAttr("offsets", &offsets_));
    OP_REQUIRES_OK(context, context->GetAttr("combiners", &names));
    OP_REQUIRES_OK(context, context->GetAttr("table_of", &table_of_));
    OP_REQUIRES_OK(context, context->GetAttr("columns", &columns_));
    OP_REQUIRES_OK(context, context->GetAttr("widths", &widths_));
    OP_REQUIRES_OK(context, context->GetAttr("output_width", &output_width_));
    OP_REQUIRES_OK(context, ParseCombiners(names, &combiners_));
    const size_t count = offsets_.size();
    OP_REQUIRES(context, count > 0 && combiners_.size() == count && table_of_.size() == count && columns_.size() == count,
                InvalidArgument("Expected one offset, combiner, table and column per entry. Received: ", count,
                                " offsets, ", combiners_.size(), " combiners, ", table_of_.size(), " tables, ",
                                columns_.size(), " columns"));
    // The entries' column blocks must tile [0, output_width) exactly: every output value is written.
    std::vector<std::pair<int64_t, int64_t>> blocks;
    for (size_t e = 0; e < count; ++e) {
      OP_REQUIRES(context, table_of_[e] >= 0 && table_of_[e] < static_cast<int64_t>(widths_.size()),
                  InvalidArgument("entry ", e, " reads table ", table_of_[e], " of ", widths_.size()));
      blocks.emplace_back(columns_[e], widths_[table_of_[e]]);
    }
    std::sort(blocks.begin(), blocks.end());
    int64_t next = 0;
    for (const auto& [column, width] : blocks) {
      OP_REQUIRES(context, column == next && width > 0,
                  InvalidArgument("the entries' columns must tile [0, ", output_width_, ") exactly; a block starts at ",
                                  column, " where ", next, " was expected"));
      next += width;
    }
    OP_REQUIRES(context, next == output_width_,
                InvalidArgument("the entries' columns end at ", next, ", not at output_width ", output_width_));
    if (context->HasAttr("limits")) {
      OP_REQUIRES_OK(context, context->GetAttr("limits", &limits_));
      OP_REQUIRES_OK(context, context->GetAttr("hotness", &hotness_));
      OP_REQUIRES_OK(context, context->GetAttr("names", &names_));
      OP_REQUIRES(context, (limits_.empty() || limits_.size() == count) && (hotness_.empty() || hotness_.size() == count),
                  InvalidArgument("Expected limits and hotness empty or one per entry. Received: ", limits_.size(),
                                  " limits, ", hotness_.size(), " hotness values, ", count, " entries"));
    }
  }

 protected:
  std::vector<int64_t> limits_, hotness_;
  std::vector<std::string> names_;
  std::vector<int64_t> offsets_, table_of_, columns_, widths_;
  std::vector<Combiner> combiners_;
  int64_t output_width_ = 0;
};

template <typename Index, typename Split>
class EmbeddingBagOp : public OpKernel, BagAttributes {
 public:
  explicit EmbeddingBagOp(OpKernelConstruction* context) : OpKernel(context), BagAttributes(context) {}

  void Compute(OpKernelContext* context) override {
    const int count = static_cast<int>(offsets_.size());
    const int tables = static_cast<int>(widths_.size());
    Entries<Index, Split> entries;
    OP_REQUIRES_OK(context, entries.Read(context, count));
    std::vector<::tensorflow::core::RefCountPtr<Var>> variables(tables);
    // Shared locks: other readers may run alongside; a dense assignment waits for us. Writers hold
    // one variable at a time, so taking several shared locks cannot deadlock with them.
    std::vector<std::unique_ptr<::tensorflow::tf_shared_lock>> locks;
    std::vector<const float*> data(tables);
    std::vector<int64_t> rows(tables);
    for (int t = 0; t < tables; ++t) {
      OP_REQUIRES_OK(context, LookupTable(context, t, &variables[t]));
      locks.push_back(std::make_unique<::tensorflow::tf_shared_lock>(*variables[t]->mu()));
      const Tensor& table = *variables[t]->tensor();
      OP_REQUIRES(context, table.dim_size(1) == widths_[t],
                  InvalidArgument("table ", t, " has width ", table.dim_size(1), "; the op was built for ", widths_[t]));
      data[t] = table.flat<float>().data();
      rows[t] = table.dim_size(0);
    }
    int64_t total = 0;
    for (int e = 0; e < count; ++e) {
      const int64_t table_rows = rows[table_of_[e]];
      // Without a limit, an entry may read up to the variable's last row.
      const int64_t limit = limits_.empty() ? table_rows - offsets_[e] : limits_[e];
      OP_REQUIRES(context, offsets_[e] >= 0 && offsets_[e] + limit <= table_rows,
                  InvalidArgument(EntryName(names_, e), ": rows [", offsets_[e], ", ", offsets_[e] + limit,
                                  ") are outside the variable's ", table_rows, " rows"));
      OP_REQUIRES_OK(context, CheckEntry(entries.values[e], entries.splits[e], entries.batch, entries.sizes[e], limit,
                                         hotness_.empty() ? 0 : hotness_[e], EntryName(names_, e)));
      total += entries.sizes[e] * widths_[table_of_[e]];
    }
    const int64_t batch = entries.batch, stride = output_width_;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({batch, stride}), &output));
    float* out = output->flat<float>().data();
    auto work = [&](int64_t begin, int64_t end) {
      // Entry by entry: the ids of samples [begin, end) of one entry are contiguous, so the row
      // kPrefetch ids ahead is known and fetched while this one is added.
      for (int e = 0; e < count; ++e) {
        const Index* ids = entries.values[e];
        const Split* split = entries.splits[e];
        const int64_t width = widths_[table_of_[e]];
        const float* base = data[table_of_[e]] + offsets_[e] * width;
        const int64_t stop = split[end];
        for (int64_t s = begin; s < end; ++s) {
          float* __restrict target = out + s * stride + columns_[e];
          const int64_t first = split[s], last = split[s + 1];
          if (first == last) std::fill(target, target + width, 0.0f);
          for (int64_t k = first; k < last; ++k) {
            if (k + kPrefetch < stop) PrefetchRow(base + static_cast<int64_t>(ids[k + kPrefetch]) * width, width);
            const float* __restrict row = base + static_cast<int64_t>(ids[k]) * width;
            if (k == first) {
              std::copy_n(row, width, target);
            } else {
              for (int64_t j = 0; j < width; ++j) target[j] += row[j];
            }
          }
          const float scale = Scale(combiners_[e], last - first);
          if (scale != 1.0f) {
            for (int64_t j = 0; j < width; ++j) target[j] *= scale;
          }
        }
      }
    };
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    const int64_t cost = batch > 0 ? total / batch + stride : 1;
    ::tensorflow::Shard(threads->num_threads, threads->workers, batch, std::max<int64_t>(cost, 1), work);
  }
};

template <typename Index, typename Split>
class EmbeddingBagGradOp : public OpKernel, BagAttributes {
 public:
  explicit EmbeddingBagGradOp(OpKernelConstruction* context) : OpKernel(context), BagAttributes(context) {}

  void Compute(OpKernelContext* context) override {
    const int count = static_cast<int>(offsets_.size());
    const int tables = static_cast<int>(widths_.size());
    Entries<Index, Split> entries;
    OP_REQUIRES_OK(context, entries.Read(context, count));
    const Tensor& upstream = context->input(0);
    const int64_t batch = entries.batch, stride = output_width_;
    OP_REQUIRES(context, upstream.dims() == 2 && upstream.dim_size(0) == batch && upstream.dim_size(1) == stride,
                InvalidArgument("Expected the gradient of shape [", batch, ", ", stride,
                                "]. Received: ", upstream.shape().DebugString()));
    // Entries whose rows may overlap (the same table, overlapping ranges [offset, offset + largest
    // id]) are deduplicated together; the layer's entries of different table slices never overlap,
    // so each slice's ids are indexed on their own (small, cache-friendly, in parallel).
    struct Slice {
      int64_t table, offset;  // offset: the group's first row in its table
      std::vector<int> entries;
      std::vector<int64_t> distinct;     // rows relative to offset
      std::vector<int64_t> starts;       // [distinct + 1]: where each row's occurrences begin
      std::vector<int64_t> occurrences;  // entry * batch + sample, grouped by row
    };
    std::vector<std::tuple<int64_t, int64_t, int64_t, int>> ranges;  // table, first row, end row, entry
    for (int e = 0; e < count; ++e) {
      int64_t largest = -1;
      for (int64_t k = 0; k < entries.sizes[e]; ++k) largest = std::max<int64_t>(largest, entries.values[e][k]);
      ranges.emplace_back(table_of_[e], offsets_[e], offsets_[e] + largest + 1, e);
    }
    std::sort(ranges.begin(), ranges.end());
    std::vector<Slice> groups;
    int64_t group_end = 0;
    for (const auto& [table, first, end, e] : ranges) {
      if (groups.empty() || groups.back().table != table || first >= group_end) {
        groups.push_back(Slice{table, first, {}, {}, {}, {}});
        group_end = end;
      }
      groups.back().entries.push_back(e);
      group_end = std::max(group_end, end);
    }
    auto index_slice = [&](Slice& slice) {
      int64_t size = 0, largest = -1;
      for (int e : slice.entries) {
        size += entries.sizes[e];
        const int64_t shift = offsets_[e] - slice.offset;
        for (int64_t k = 0; k < entries.sizes[e]; ++k) largest = std::max<int64_t>(largest, entries.values[e][k] + shift);
      }
      std::vector<int32_t> slot_of(size);
      std::vector<int64_t> code_of(size);
      DistinctIds ids_of_slice(largest, size);
      int64_t position = 0;
      for (int e : slice.entries) {
        const Index* ids = entries.values[e];
        const Split* split = entries.splits[e];
        const int64_t shift = offsets_[e] - slice.offset;
        for (int64_t s = 0; s < batch; ++s) {
          for (int64_t k = split[s]; k < split[s + 1]; ++k, ++position) {
            slot_of[position] = ids_of_slice.Find(static_cast<int64_t>(ids[k]) + shift);
            code_of[position] = e * batch + s;
          }
        }
      }
      slice.distinct = ids_of_slice.distinct();
      GroupBySlot(slot_of.data(), size, static_cast<int64_t>(slice.distinct.size()), [&](int64_t p) { return code_of[p]; },
                  &slice.starts, &slice.occurrences);
    };
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(threads->num_threads, threads->workers, static_cast<int64_t>(groups.size()), 1 << 20,
                        [&](int64_t begin, int64_t end) {
                          for (int64_t g = begin; g < end; ++g) index_slice(groups[g]);
                        });
    // Rows of all slices in one numbering (for the threads); each table's rows in its own output.
    std::vector<int64_t> first_row(groups.size() + 1, 0), row_in_table(groups.size(), 0), table_total(tables, 0);
    for (size_t g = 0; g < groups.size(); ++g) {
      first_row[g + 1] = first_row[g] + groups[g].distinct.size();
      row_in_table[g] = table_total[groups[g].table];
      table_total[groups[g].table] += groups[g].distinct.size();
    }
    OpOutputListHelper outputs(context, tables);
    std::vector<Index*> rows_out(tables);
    std::vector<float*> summed_out(tables);
    for (int t = 0; t < tables; ++t) {
      Tensor* rows_tensor = nullptr;
      Tensor* summed_tensor = nullptr;
      OP_REQUIRES_OK(context, outputs.rows.allocate(t, TensorShape({table_total[t]}), &rows_tensor));
      OP_REQUIRES_OK(context, outputs.summed.allocate(t, TensorShape({table_total[t], widths_[t]}), &summed_tensor));
      rows_out[t] = rows_tensor->flat<Index>().data();
      summed_out[t] = summed_tensor->flat<float>().data();
    }
    const int64_t total = first_row.back();
    const float* gradient = upstream.flat<float>().data();
    // Each entry's per-sample scale, computed once.
    std::vector<std::vector<float>> scales(count);
    for (int e = 0; e < count; ++e) {
      if (combiners_[e] == Combiner::kSum) continue;
      scales[e].resize(batch);
      for (int64_t s = 0; s < batch; ++s) scales[e][s] = Scale(combiners_[e], entries.splits[e][s + 1] - entries.splits[e][s]);
    }
    auto work = [&](int64_t begin, int64_t end) {
      size_t g = std::upper_bound(first_row.begin(), first_row.end(), begin) - first_row.begin() - 1;
      for (int64_t r = begin; r < end; ++r) {
        while (r >= first_row[g + 1]) ++g;
        const Slice& slice = groups[g];
        const int64_t u = r - first_row[g], width = widths_[slice.table];
        const int64_t out_row = row_in_table[g] + u;
        rows_out[slice.table][out_row] = static_cast<Index>(slice.distinct[u] + slice.offset);
        float* __restrict target = summed_out[slice.table] + out_row * width;
        std::fill(target, target + width, 0.0f);
        const int64_t stop = slice.starts[u + 1];
        for (int64_t o = slice.starts[u]; o < stop; ++o) {
          if (o + kPrefetch < stop) {
            const int64_t ahead = slice.occurrences[o + kPrefetch];
            PrefetchRow(gradient + (ahead % batch) * stride + columns_[ahead / batch], width);
          }
          const int64_t code = slice.occurrences[o];
          const int64_t e = code / batch, s = code % batch;
          const float* __restrict source = gradient + s * stride + columns_[e];
          if (scales[e].empty()) {
            for (int64_t j = 0; j < width; ++j) target[j] += source[j];
          } else {
            const float scale = scales[e][s];
            for (int64_t j = 0; j < width; ++j) target[j] += scale * source[j];
          }
        }
      }
    };
    int64_t occurrences = 0;
    for (const auto& slice : groups) occurrences += slice.occurrences.size();
    const int64_t cost = total > 0 ? (occurrences / total + 1) * (stride / tables + 1) : 1;
    ::tensorflow::Shard(threads->num_threads, threads->workers, total, cost, work);
  }

 private:
  // The two output lists, rows: T * Tindices and summed: T * float.
  struct OpOutputListHelper {
    OpOutputListHelper(OpKernelContext* context, int tables) {
      OP_REQUIRES_OK(context, context->output_list("rows", &rows));
      OP_REQUIRES_OK(context, context->output_list("summed", &summed));
    }
    ::tensorflow::OpOutputList rows, summed;
  };
};

// Called with the variable's lock held exclusively, before rows are written in place: a buffer
// still shared with a tensor read from it earlier (copy-on-write mode) is copied once and the
// variable switched to copy-on-read mode, as TensorFlow's own sparse updates do
// (EnsureSparseVariableAccess).
::tensorflow::Status PrepareSparseWrite(OpKernelContext* context, Var* variable) {
  Tensor* table = variable->tensor();
  if (!variable->copy_on_read_mode.load()) {
    if (!table->RefCountIsOne()) {
      Tensor copy;
      TF_RETURN_IF_ERROR(context->allocate_temp(table->dtype(), table->shape(), &copy));
      std::copy_n(table->flat<float>().data(), table->NumElements(), copy.flat<float>().data());
      *table = copy;
    }
    variable->copy_on_read_mode.store(true);
  }
  return ::tensorflow::OkStatus();
}

// Lazy Adam on distinct rows (tf_dlrm/optimizers/lazy_adam.py has the formula): inputs table, m, v
// (resources of one shape), rows [U], gradient [U, width], alpha (the bias-corrected rate); one pass
// per row, rows sharded over the threads.
template <typename Index>
class SparseApplyLazyAdamOp : public OpKernel {
 public:
  explicit SparseApplyLazyAdamOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("beta_1", &beta_1_));
    OP_REQUIRES_OK(context, context->GetAttr("beta_2", &beta_2_));
    // 1 - beta, computed by the caller in double precision and rounded once (1 - 0.99f in float
    // differs from float(1 - 0.99) by 1e-6 relative).
    OP_REQUIRES_OK(context, context->GetAttr("one_minus_beta_1", &keep_1_));
    OP_REQUIRES_OK(context, context->GetAttr("one_minus_beta_2", &keep_2_));
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& rows = context->input(3);
    const Tensor& gradient = context->input(4);
    const Tensor& alpha_tensor = context->input(5);
    OP_REQUIRES(context, ::tensorflow::TensorShapeUtils::IsScalar(alpha_tensor.shape()),
                InvalidArgument("Expected a scalar alpha. Received: ", alpha_tensor.shape().DebugString()));
    ::tensorflow::core::RefCountPtr<Var> variables[3];
    for (int i = 0; i < 3; ++i) OP_REQUIRES_OK(context, LookupTable(context, i, &variables[i]));
    // Exclusive locks in address order (as TensorFlow orders its training ops' locks).
    std::vector<::tensorflow::mutex*> order = {variables[0]->mu(), variables[1]->mu(), variables[2]->mu()};
    std::sort(order.begin(), order.end());
    order.erase(std::unique(order.begin(), order.end()), order.end());
    std::vector<std::unique_ptr<::tensorflow::mutex_lock>> locks;
    for (auto* mu : order) locks.push_back(std::make_unique<::tensorflow::mutex_lock>(*mu));
    for (int i = 0; i < 3; ++i) OP_REQUIRES_OK(context, PrepareSparseWrite(context, variables[i].get()));
    const TensorShape& shape = variables[0]->tensor()->shape();
    OP_REQUIRES(context, variables[1]->tensor()->shape() == shape && variables[2]->tensor()->shape() == shape,
                InvalidArgument("Expected m and v shaped like the table ", shape.DebugString()));
    const int64_t count = rows.NumElements(), width = shape.dim_size(1), limit = shape.dim_size(0);
    OP_REQUIRES(context, rows.dims() == 1 && gradient.dims() == 2 && gradient.dim_size(0) == count &&
                             gradient.dim_size(1) == width,
                InvalidArgument("Expected rows [U] and a gradient [U, ", width, "]. Received: ",
                                rows.shape().DebugString(), ", ", gradient.shape().DebugString()));
    const Index* row = rows.flat<Index>().data();
    for (int64_t u = 0; u < count; ++u) {
      OP_REQUIRES(context, static_cast<uint64_t>(static_cast<int64_t>(row[u])) < static_cast<uint64_t>(limit),
                  InvalidArgument("row ", static_cast<int64_t>(row[u]), " at position ", u, " is outside [0, ", limit, ")"));
    }
    const float alpha = alpha_tensor.scalar<float>()();
    const float beta_1 = beta_1_, beta_2 = beta_2_, epsilon = epsilon_;
    const float keep_1 = keep_1_, keep_2 = keep_2_;
    float* table = variables[0]->tensor()->flat<float>().data();
    float* m = variables[1]->tensor()->flat<float>().data();
    float* v = variables[2]->tensor()->flat<float>().data();
    const float* values = gradient.flat<float>().data();
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t u = begin; u < end; ++u) {
        if (u + kPrefetch < end) {
          const int64_t ahead = static_cast<int64_t>(row[u + kPrefetch]) * width;
          PrefetchRow(table + ahead, width);
          PrefetchRow(m + ahead, width);
          PrefetchRow(v + ahead, width);
        }
        const int64_t at = static_cast<int64_t>(row[u]) * width;
        const float* __restrict g = values + u * width;
        float* __restrict w = table + at;
        float* __restrict mu = m + at;
        float* __restrict nu = v + at;
        for (int64_t j = 0; j < width; ++j) {
          const float first = beta_1 * mu[j] + keep_1 * g[j];
          const float second = beta_2 * nu[j] + keep_2 * (g[j] * g[j]);
          mu[j] = first;
          nu[j] = second;
          w[j] -= alpha * first / (std::sqrt(second) + epsilon);
        }
      }
    };
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(threads->num_threads, threads->workers, count, 12 * width, work);
  }

 private:
  float beta_1_, beta_2_, keep_1_, keep_2_, epsilon_;
};

// Catch-up Adam on distinct rows (tf_dlrm/optimizers/catch_up_adam.py has the derivation): inputs
// table, m, v, last_step (resources of one shape), rows [U], gradient [U, width], alpha (the
// bias-corrected rate of this step), step (this step's number, written to last_step), tails (Q(n) of
// the derivation, n = 0 .. N: Q(N) holds for every later n) and constants [log beta_1, log beta_2,
// log(beta_1 / sqrt(beta_2)), learning rate], all double; one pass per row, rows sharded over the
// threads. A row reads its last update's step from its own last_step entry, so the catch-up costs no
// access beyond the row's.
template <typename Index>
class SparseApplyCatchUpAdamOp : public OpKernel {
 public:
  explicit SparseApplyCatchUpAdamOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("beta_1", &beta_1_));
    OP_REQUIRES_OK(context, context->GetAttr("beta_2", &beta_2_));
    OP_REQUIRES_OK(context, context->GetAttr("one_minus_beta_1", &keep_1_));
    OP_REQUIRES_OK(context, context->GetAttr("one_minus_beta_2", &keep_2_));
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& rows = context->input(4);
    const Tensor& gradient = context->input(5);
    const Tensor& alpha_tensor = context->input(6);
    const Tensor& step_tensor = context->input(7);
    const Tensor& tails_tensor = context->input(8);
    const Tensor& constants_tensor = context->input(9);
    OP_REQUIRES(context, ::tensorflow::TensorShapeUtils::IsScalar(alpha_tensor.shape()) &&
                             ::tensorflow::TensorShapeUtils::IsScalar(step_tensor.shape()) &&
                             tails_tensor.dims() == 1 && tails_tensor.NumElements() > 0 &&
                             constants_tensor.NumElements() == 4,
                InvalidArgument("Expected scalars alpha and step, tails [N + 1] and 4 constants. Received: ",
                                alpha_tensor.shape().DebugString(), ", ", step_tensor.shape().DebugString(), ", ",
                                tails_tensor.shape().DebugString(), ", ", constants_tensor.shape().DebugString()));
    ::tensorflow::core::RefCountPtr<Var> variables[4];
    for (int i = 0; i < 4; ++i) OP_REQUIRES_OK(context, LookupTable(context, i, &variables[i]));
    std::vector<::tensorflow::mutex*> order;
    for (auto& variable : variables) order.push_back(variable->mu());
    std::sort(order.begin(), order.end());
    order.erase(std::unique(order.begin(), order.end()), order.end());
    std::vector<std::unique_ptr<::tensorflow::mutex_lock>> locks;
    for (auto* mu : order) locks.push_back(std::make_unique<::tensorflow::mutex_lock>(*mu));
    for (int i = 0; i < 4; ++i) OP_REQUIRES_OK(context, PrepareSparseWrite(context, variables[i].get()));
    const TensorShape& shape = variables[0]->tensor()->shape();
    for (int i = 1; i < 4; ++i) {
      OP_REQUIRES(context, variables[i]->tensor()->shape() == shape,
                  InvalidArgument("Expected m, v and last_step shaped like the table ", shape.DebugString()));
    }
    const int64_t count = rows.NumElements(), width = shape.dim_size(1), limit = shape.dim_size(0);
    OP_REQUIRES(context, rows.dims() == 1 && gradient.dims() == 2 && gradient.dim_size(0) == count &&
                             gradient.dim_size(1) == width && width > 0,
                InvalidArgument("Expected rows [U] and a gradient [U, ", width, "]. Received: ",
                                rows.shape().DebugString(), ", ", gradient.shape().DebugString()));
    const Index* row = rows.flat<Index>().data();
    for (int64_t u = 0; u < count; ++u) {
      OP_REQUIRES(context, static_cast<uint64_t>(static_cast<int64_t>(row[u])) < static_cast<uint64_t>(limit),
                  InvalidArgument("row ", static_cast<int64_t>(row[u]), " at position ", u, " is outside [0, ", limit, ")"));
    }
    const float alpha = alpha_tensor.scalar<float>()();
    const double step = step_tensor.scalar<double>()();
    const double* tails = tails_tensor.flat<double>().data();
    const int64_t last_tail = tails_tensor.NumElements() - 1;
    const double* constants = constants_tensor.flat<double>().data();
    const double log_beta_1 = constants[0], log_beta_2 = constants[1], log_ratio = constants[2], rate = constants[3];
    auto tail = [&](double n) { return tails[n >= static_cast<double>(last_tail) ? last_tail : static_cast<int64_t>(n)]; };
    const double tail_before = tail(step - 1.0);
    const float beta_1 = beta_1_, beta_2 = beta_2_, epsilon = epsilon_, keep_1 = keep_1_, keep_2 = keep_2_;
    const float now = static_cast<float>(step);
    float* table = variables[0]->tensor()->flat<float>().data();
    float* m = variables[1]->tensor()->flat<float>().data();
    float* v = variables[2]->tensor()->flat<float>().data();
    float* last = variables[3]->tensor()->flat<float>().data();
    const float* values = gradient.flat<float>().data();
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t u = begin; u < end; ++u) {
        if (u + kPrefetch < end) {
          const int64_t ahead = static_cast<int64_t>(row[u + kPrefetch]) * width;
          PrefetchRow(table + ahead, width);
          PrefetchRow(m + ahead, width);
          PrefetchRow(v + ahead, width);
          PrefetchRow(last + ahead, 1);
        }
        const int64_t at = static_cast<int64_t>(row[u]) * width;
        const float* __restrict g = values + u * width;
        float* __restrict w = table + at;
        float* __restrict mu = m + at;
        float* __restrict nu = v + at;
        float* __restrict seen = last + at;
        const double previous = seen[0], skipped = step - 1.0 - previous;
        if (previous <= 0.0 || skipped <= 0.0) {  // never touched (no moments) or touched in the previous step
          for (int64_t j = 0; j < width; ++j) {
            const float first = beta_1 * mu[j] + keep_1 * g[j];
            const float second = beta_2 * nu[j] + keep_2 * (g[j] * g[j]);
            mu[j] = first;
            nu[j] = second;
            w[j] -= alpha * first / (std::sqrt(second) + epsilon);
            seen[j] = now;
          }
          continue;
        }
        const float pending = static_cast<float>(rate * (tail(previous) - std::exp(skipped * log_ratio) * tail_before));
        const float first_decay = beta_1 * static_cast<float>(std::exp(skipped * log_beta_1));
        const float second_decay = beta_2 * static_cast<float>(std::exp(skipped * log_beta_2));
        for (int64_t j = 0; j < width; ++j) {
          const float moved = pending * mu[j] / (std::sqrt(nu[j]) + epsilon);
          const float first = first_decay * mu[j] + keep_1 * g[j];
          const float second = second_decay * nu[j] + keep_2 * (g[j] * g[j]);
          mu[j] = first;
          nu[j] = second;
          w[j] -= moved + alpha * first / (std::sqrt(second) + epsilon);
          seen[j] = now;
        }
      }
    };
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(threads->num_threads, threads->workers, count, 20 * width, work);
  }

 private:
  float beta_1_, beta_2_, keep_1_, keep_2_, epsilon_;
};

// target[j] -= rate * source[j], rounded after the product and after the difference (no fused
// multiply-add): the same bits as TensorFlow's sparse SGD kernels.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
void SubtractScaled(float* __restrict target, const float* __restrict source, float rate, int64_t width) {
  for (int64_t j = 0; j < width; ++j) target[j] -= rate * source[j];
}
void SubtractScaled(float* __restrict target, const ::tensorflow::bfloat16* __restrict source, float rate, int64_t width) {
  for (int64_t j = 0; j < width; ++j) target[j] -= rate * static_cast<float>(source[j]);
}
#pragma GCC pop_options

template <typename Index, typename Gradient>
class SparseApplySgdOp : public OpKernel {
 public:
  explicit SparseApplySgdOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("distinct_rows", &distinct_rows_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& rows = context->input(1);
    const Tensor& gradient = context->input(2);
    const Tensor& rate_tensor = context->input(3);
    OP_REQUIRES(context, ::tensorflow::TensorShapeUtils::IsScalar(rate_tensor.shape()),
                InvalidArgument("Expected a scalar learning_rate. Received: ", rate_tensor.shape().DebugString()));
    ::tensorflow::core::RefCountPtr<Var> variable;
    OP_REQUIRES_OK(context, LookupTable(context, 0, &variable));
    // Exclusive: the rows are written in place. A variable's buffer may be shared with a tensor
    // read from it earlier (copy-on-write mode); it is copied once and the variable switched to
    // copy-on-read mode, as TensorFlow's own sparse updates do (EnsureSparseVariableAccess).
    ::tensorflow::mutex_lock lock(*variable->mu());
    OP_REQUIRES_OK(context, PrepareSparseWrite(context, variable.get()));
    Tensor* table = variable->tensor();
    const int64_t count = rows.NumElements(), width = table->dim_size(1), limit = table->dim_size(0);
    OP_REQUIRES(context, rows.dims() == 1 && gradient.dims() == 2 && gradient.dim_size(0) == count &&
                             gradient.dim_size(1) == width,
                InvalidArgument("Expected rows [U] and a gradient [U, ", width, "]. Received: ",
                                rows.shape().DebugString(), ", ", gradient.shape().DebugString()));
    const Index* row = rows.flat<Index>().data();
    for (int64_t u = 0; u < count; ++u) {
      OP_REQUIRES(context, static_cast<uint64_t>(static_cast<int64_t>(row[u])) < static_cast<uint64_t>(limit),
                  InvalidArgument("row ", static_cast<int64_t>(row[u]), " at position ", u, " is outside [0, ", limit, ")"));
    }
    const float rate = rate_tensor.scalar<float>()();
    float* data = table->flat<float>().data();
    const Gradient* values = gradient.flat<Gradient>().data();
    if (!distinct_rows_) {
      // A repeated row gets its entries one after another, in their order (as TensorFlow's
      // sequential sparse SGD); the threads share out blocks of rows.
      ForEachEntryInRowBlocks(context, count, width * static_cast<int64_t>(sizeof(float)),
                              [&](int64_t u) { return static_cast<int64_t>(row[u]); },
                              [&](int64_t u, int64_t r) { SubtractScaled(data + r * width, values + u * width, rate, width); });
      return;
    }
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t u = begin; u < end; ++u) {
        if (u + kPrefetch < end) PrefetchRow(data + static_cast<int64_t>(row[u + kPrefetch]) * width, width);
        float* __restrict target = data + static_cast<int64_t>(row[u]) * width;
        const Gradient* __restrict source = values + u * width;
        for (int64_t j = 0; j < width; ++j) target[j] -= rate * static_cast<float>(source[j]);
      }
    };
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(threads->num_threads, threads->workers, count, 2 * width, work);
  }

 private:
  bool distinct_rows_ = true;
};

::tensorflow::Status BagShape(InferenceContext* c) {
  int64_t tables, entries, width;
  TF_RETURN_IF_ERROR(c->GetAttr("T", &tables));
  TF_RETURN_IF_ERROR(c->GetAttr("E", &entries));
  TF_RETURN_IF_ERROR(c->GetAttr("output_width", &width));
  // Inputs: tables[T], values[E], row_splits[E]: the batch is row_splits[0]'s length - 1.
  auto samples = c->Dim(c->input(tables + entries), 0);
  ::tensorflow::shape_inference::DimensionHandle batch;
  TF_RETURN_IF_ERROR(c->Subtract(samples, 1, &batch));
  c->set_output(0, c->Matrix(batch, width));
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("TfDlrmEmbeddingBag")
    .Input("tables: T * resource")
    .Input("values: E * Tindices")
    .Input("row_splits: E * Tsplits")
    .Output("pooled: float")
    .Attr("T: int >= 1")
    .Attr("E: int >= 1")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tsplits: {int32, int64}")
    .Attr("offsets: list(int)")
    .Attr("combiners: list(string)")
    .Attr("table_of: list(int)")
    .Attr("columns: list(int)")
    .Attr("widths: list(int)")
    .Attr("output_width: int >= 1")
    .Attr("limits: list(int) = []")
    .Attr("hotness: list(int) = []")
    .Attr("names: list(string) = []")
    .SetShapeFn(BagShape);

REGISTER_OP("TfDlrmEmbeddingBagGrad")
    .Input("gradient: float")
    .Input("values: E * Tindices")
    .Input("row_splits: E * Tsplits")
    .Output("rows: T * Tindices")
    .Output("summed: T * float")
    .Attr("T: int >= 1")
    .Attr("E: int >= 1")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tsplits: {int32, int64}")
    .Attr("offsets: list(int)")
    .Attr("combiners: list(string)")
    .Attr("table_of: list(int)")
    .Attr("columns: list(int)")
    .Attr("widths: list(int)")
    .Attr("output_width: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<int64_t> widths;
      TF_RETURN_IF_ERROR(c->GetAttr("widths", &widths));
      for (size_t t = 0; t < widths.size(); ++t) {
        c->set_output(t, c->Vector(InferenceContext::kUnknownDim));
        c->set_output(widths.size() + t, c->Matrix(InferenceContext::kUnknownDim, widths[t]));
      }
      return ::tensorflow::OkStatus();
    });

REGISTER_OP("TfDlrmGatherRows")
    .Input("table: resource")
    .Input("indices: Tindices")
    .Output("rows: T")
    .Attr("Tindices: {int32, int64}")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle indices;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &indices));
      c->set_output(0, c->Matrix(c->Dim(indices, 0), InferenceContext::kUnknownDim));
      return ::tensorflow::OkStatus();
    });

REGISTER_OP("TfDlrmSparseApplySgd")
    .Input("table: resource")
    .Input("rows: Tindices")
    .Input("gradient: Tgradient")
    .Input("learning_rate: float")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tgradient: {float, bfloat16} = DT_FLOAT")
    .Attr("distinct_rows: bool = true")
    .SetShapeFn([](InferenceContext* c) { return ::tensorflow::OkStatus(); });

// table[indices[i]] converted to T, one thread per block of rows, under the variable's shared lock.
template <typename Index, typename T>
class GatherRowsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* context) override {
    const Tensor& indices = context->input(1);
    OP_REQUIRES(context, indices.dims() == 1,
                InvalidArgument("Expected indices [n]. Received: ", indices.shape().DebugString()));
    ::tensorflow::core::RefCountPtr<Var> variable;
    OP_REQUIRES_OK(context, LookupTable(context, 0, &variable));
    ::tensorflow::tf_shared_lock lock(*variable->mu());
    const Tensor& table = *variable->tensor();
    const int64_t count = indices.NumElements(), width = table.dim_size(1), limit = table.dim_size(0);
    const Index* index = indices.flat<Index>().data();
    for (int64_t i = 0; i < count; ++i) {
      OP_REQUIRES(context, static_cast<uint64_t>(static_cast<int64_t>(index[i])) < static_cast<uint64_t>(limit),
                  InvalidArgument("indices[", i, "] = ", static_cast<int64_t>(index[i]), " is not in [0, ", limit, ")"));
    }
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({count, width}), &output));
    const float* data = table.flat<float>().data();
    T* out = output->flat<T>().data();
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (i + kPrefetch < end) PrefetchRow(data + static_cast<int64_t>(index[i + kPrefetch]) * width, width);
        const float* __restrict source = data + static_cast<int64_t>(index[i]) * width;
        T* __restrict target = out + i * width;
        for (int64_t j = 0; j < width; ++j) target[j] = static_cast<T>(source[j]);
      }
    };
    auto* threads = context->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(threads->num_threads, threads->workers, count, 2 * width, work);
  }
};

#define TF_DLRM_REGISTER_BAG(index, split)                                                                  \
  REGISTER_KERNEL_BUILDER(Name("TfDlrmEmbeddingBag")                                                        \
                              .Device(::tensorflow::DEVICE_CPU)                                             \
                              .HostMemory("tables")                                                         \
                              .TypeConstraint<index>("Tindices")                                            \
                              .TypeConstraint<split>("Tsplits"),                                            \
                          EmbeddingBagOp<index, split>);                                                    \
  REGISTER_KERNEL_BUILDER(Name("TfDlrmEmbeddingBagGrad")                                                    \
                              .Device(::tensorflow::DEVICE_CPU)                                             \
                              .TypeConstraint<index>("Tindices")                                            \
                              .TypeConstraint<split>("Tsplits"),                                            \
                          EmbeddingBagGradOp<index, split>);
TF_DLRM_REGISTER_BAG(int32_t, int32_t)
TF_DLRM_REGISTER_BAG(int32_t, int64_t)
TF_DLRM_REGISTER_BAG(int64_t, int32_t)
TF_DLRM_REGISTER_BAG(int64_t, int64_t)
#undef TF_DLRM_REGISTER_BAG

REGISTER_OP("TfDlrmSparseApplyLazyAdam")
    .Input("table: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("rows: Tindices")
    .Input("gradient: float")
    .Input("alpha: float")
    .Attr("Tindices: {int32, int64}")
    .Attr("beta_1: float")
    .Attr("beta_2: float")
    .Attr("one_minus_beta_1: float")
    .Attr("one_minus_beta_2: float")
    .Attr("epsilon: float")
    .SetShapeFn([](InferenceContext* c) { return ::tensorflow::OkStatus(); });

REGISTER_KERNEL_BUILDER(Name("TfDlrmSparseApplyLazyAdam").Device(::tensorflow::DEVICE_CPU).TypeConstraint<int32_t>("Tindices"),
                        SparseApplyLazyAdamOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("TfDlrmSparseApplyLazyAdam").Device(::tensorflow::DEVICE_CPU).TypeConstraint<int64_t>("Tindices"),
                        SparseApplyLazyAdamOp<int64_t>);
REGISTER_OP("TfDlrmSparseApplyCatchUpAdam")
    .Input("table: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("last_step: resource")
    .Input("rows: Tindices")
    .Input("gradient: float")
    .Input("alpha: float")
    .Input("step: double")
    .Input("tails: double")
    .Input("constants: double")
    .Attr("Tindices: {int32, int64}")
    .Attr("beta_1: float")
    .Attr("beta_2: float")
    .Attr("one_minus_beta_1: float")
    .Attr("one_minus_beta_2: float")
    .Attr("epsilon: float")
    .SetShapeFn([](InferenceContext* c) { return ::tensorflow::OkStatus(); });

REGISTER_KERNEL_BUILDER(Name("TfDlrmSparseApplyCatchUpAdam").Device(::tensorflow::DEVICE_CPU).TypeConstraint<int32_t>("Tindices"),
                        SparseApplyCatchUpAdamOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("TfDlrmSparseApplyCatchUpAdam").Device(::tensorflow::DEVICE_CPU).TypeConstraint<int64_t>("Tindices"),
                        SparseApplyCatchUpAdamOp<int64_t>);
#define TF_DLRM_REGISTER_ROWS(index, value)                                                                 \
  REGISTER_KERNEL_BUILDER(Name("TfDlrmSparseApplySgd")                                                      \
                              .Device(::tensorflow::DEVICE_CPU)                                             \
                              .TypeConstraint<index>("Tindices")                                            \
                              .TypeConstraint<value>("Tgradient"),                                          \
                          SparseApplySgdOp<index, value>);                                                  \
  REGISTER_KERNEL_BUILDER(Name("TfDlrmGatherRows")                                                          \
                              .Device(::tensorflow::DEVICE_CPU)                                             \
                              .HostMemory("table")                                                          \
                              .TypeConstraint<index>("Tindices")                                            \
                              .TypeConstraint<value>("T"),                                                  \
                          GatherRowsOp<index, value>);
TF_DLRM_REGISTER_ROWS(int32_t, float)
TF_DLRM_REGISTER_ROWS(int64_t, float)
TF_DLRM_REGISTER_ROWS(int32_t, ::tensorflow::bfloat16)
TF_DLRM_REGISTER_ROWS(int64_t, ::tensorflow::bfloat16)
#undef TF_DLRM_REGISTER_ROWS

}  // namespace tf_dlrm
