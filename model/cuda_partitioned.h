// Partitioned training of one tree on the GPU: the CUDA twin of model/partitioned.h, the same
// schedule (forward a piece with its gateway as external KV prefixes, then its child pieces
// recursively, then its backward) and the same gradient relay (per piece, per layer fp32 K/V
// gradient accumulators that child gateways add into and the piece's backward reads).
//
// Limits: one gateway segment is one external prefix of the attention, so a piece's gateway may
// have at most cuda::kMaxExternalKV segments (a tt::Error says so otherwise).
#pragma once

#include "data/partition.h"
#include "data/tree.h"
#include "model/cuda_model.h"
#include "model/partitioned.h"

namespace tt::model {

// Forward and backward of `split_tree` (data::split_long_nodes output) through `plan`
// (data::plan_partition of it): grads() += d(loss)/d(params); returns loss_scale * sum w * ce.
double forward_backward_partitioned(CudaModel& model, const data::Tree& split_tree, const data::Partition& plan,
                                    double loss_scale, PartitionRunStats* stats = nullptr);

}  // namespace tt::model
