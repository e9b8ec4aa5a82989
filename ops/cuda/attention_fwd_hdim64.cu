// Forward tree attention, head dim 64 (one instantiation per file: parallel compiles).
#include "ops/cuda/attention_launch.cuh"

namespace tt::cuda {
template void run_attention_fwd<64>(const AttnFwdParams& p, cudaStream_t stream);
}  // namespace tt::cuda
