// Backward tree attention, head dim 64 (one instantiation per file: parallel compiles).
#include "ops/cuda/attention_launch.cuh"

namespace tt::cuda {
template void run_attention_bwd<64>(const AttnBwdParams& p, cudaStream_t stream);
}  // namespace tt::cuda
