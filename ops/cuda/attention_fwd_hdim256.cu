// Forward tree attention, head dim 256 (one instantiation per file: parallel compiles).
#include "ops/cuda/attention_launch.cuh"

namespace tt::cuda {
template void run_attention_fwd<256>(const AttnFwdParams& p, cudaStream_t stream);
}  // namespace tt::cuda
