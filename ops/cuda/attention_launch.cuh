// Launchers of the CUDA tree attention: grid, block, shared memory and stream of each kernel of
// attention_sm90.cuh (wgmma) and attention_bwd_rows.cuh (the backward's row passes). One
// attention_{fwd,bwd}_hdim{64,128,256}.cu instantiates each, so the head dims compile in parallel;
// attention.cc owns the runtime -> template dispatch.
#pragma once

#include <cuda_runtime.h>

#include "ops/cuda/attention_device.cuh"
#include "ops/cuda/attention_params.h"
#include "ops/cuda/attention_sm90_device.cuh"
#include "ops/cuda/attention_sm90.cuh"
#include "base/check.h"
#include "ops/cuda/check.h"

namespace tt::cuda {

// One block per grid cell with config C's threads and dynamic shared memory.
template <class C, class Kernel, class Params>
void launch(Kernel* kernel, dim3 grid, const Params& p, cudaStream_t stream) {
  TT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::kSmemBytes));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  TT_CUDA_CHECK_LAUNCH();
}

template <int HS>
void run_attention_fwd(const AttnFwdParams& p, cudaStream_t stream) {
  static_assert(attn::sm90::FwdConfig<HS>::BM == kFwdItemRows, "items are the forward's query tiles");
  TT_CHECK(p.fwd_items >= 1, "attention forward: fwd_items=", p.fwd_items, ", expected >= 1 (make_fwd_params)");
  launch<attn::sm90::FwdConfig<HS>>(attn::sm90::attention_fwd_kernel<HS>, dim3(fwd_blocks(p)), p, stream);
}

template <int HS>
void run_attention_bwd(const AttnBwdParams& p, cudaStream_t stream) {
  constexpr int kSmallThreads = 256;
  using C = attn::sm90::BwdConfig<HS>;

  const int64_t pre_threads = (int64_t)p.n_pad * p.nh * 32;
  attn::attention_bwd_preprocess_kernel<HS>
      <<<(unsigned)((pre_threads + kSmallThreads - 1) / kSmallThreads), kSmallThreads, 0, stream>>>(p);
  TT_CUDA_CHECK_LAUNCH();

  AttnBwdParams pc = p;
  pc.dq_blocked = 1;  // the key-tile kernel's vector reductions write the blocked layout
  set_bwd_schedule(pc, C::BN);
  launch<C>(attn::sm90::bwd_kernel<HS>(), dim3((unsigned)pc.key_tiles * pc.nkv), pc, stream);

  const int64_t chunks = dq_convert_threads(pc, HS);
  attn::attention_dq_convert_kernel<HS>
      <<<(unsigned)((chunks + kSmallThreads - 1) / kSmallThreads), kSmallThreads, 0, stream>>>(pc);
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace tt::cuda
