// Backward tree attention, head dim 256 (one instantiation per file: parallel compiles).
#include "ops/cuda/attention_launch.cuh"

namespace tt::cuda {
template void run_attention_bwd<256>(const AttnBwdParams& p, cudaStream_t stream);
}  // namespace tt::cuda
