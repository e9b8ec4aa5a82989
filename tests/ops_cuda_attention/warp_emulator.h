// Runs CUDA kernels on the CPU (the tree attention's, the Gated DeltaNet's), threads and warps:
// every CUDA thread of a block is a fiber (ucontext to start it, then _setjmp / _longjmp: a switch
// without swapcontext's signal-mask system call, which took about half of the emulation's time)
// scheduled on one OS thread; warp collectives (shuffles, ballots, __syncwarp) and __syncthreads
// suspend a fiber until its warp (or block) has arrived, then compute every lane's result. The primitives of ops/cuda/attention_device.cuh are emulated too:
// cp.async copies are deferred to the cp.async.wait that covers them, so a read before its wait
// sees stale shared memory, which starts filled with NaN. wgmma_emulator.h adds warpgroup
// collectives and the Hopper primitives on top of it.
//
// Other warp collectives (mma_emulator.h's ldmatrix and mma.sync) run as a function over the
// warp's 32 lanes once all have arrived (Op::kWarpFn).
//
// fp32 subnormals flush to zero inside a launch (MXCSR FTZ and DAZ), as the GPU build's
// --use_fast_math does for fp32 arithmetic; the emulated MMAs then flush subnormal operands too,
// which the tensor cores keep (below 2^-126: under every bound). Static __shared__ variables are
// host statics, one for every block and launch: zero at first, then what the last block left, so
// a read before the block's own write goes unseen. A launch can start the dynamic shared memory
// dynamic_smem_offset() bytes past a 1024-byte boundary of the shared window (where static shared
// variables push it on the GPU), so a kernel that aligns its own tiles is checked doing so.
//
// It checks the kernels' indexing, pipelining and tile logic where CI has no GPU; it does not see
// timing races between warps or bank conflicts. The fiber switch is _setjmp / _longjmp between
// stacks: glibc's _FORTIFY_SOURCE check (__longjmp_chk) would abort it and the sanitizers cannot
// follow it, so the emulation tests build with -U_FORTIFY_SOURCE and are tagged no_sanitize.
// Include it (through wgmma_emulator.h) before the kernels, in one translation unit, and nothing
// of CUDA device code besides.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <setjmp.h>
#if defined(__USE_FORTIFY_LEVEL) && __USE_FORTIFY_LEVEL > 0
#error "warp_emulator.h switches stacks by _longjmp, which _FORTIFY_SOURCE rejects: build with -U_FORTIFY_SOURCE"
#endif
#include <xmmintrin.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <functional>
#include <vector>

namespace tt::cuda::emu {

// kWarpFn: a warp collective computed by a function of the 32 lanes (Fiber::warp_fn); kWgmma: a
// warpgroup (4 warps) collective (wgmma_emulator.h); kYield: waiting on an mbarrier or a named
// barrier, rescheduled every round until its condition holds.
enum class Op { kRun, kSync, kWarpSync, kShfl, kBallot, kWarpFn, kWgmma, kYield, kDone };

// One thread's operands of a warpgroup MMA (wgmma_emulator.h).
struct WgmmaOperands {
  int n = 0;  // N of m64nNk16
  bool rs = false, accumulate = false;
  int ta = 0, tb = 0;
  uint64_t desc_a = 0, desc_b = 0;
  uint32_t a[4] = {};
  float* d = nullptr;  // the thread's N / 2 accumulators
};

struct MbarState {
  int count = 0, pending = 0;
  int64_t tx = 0;
  int phase = 0;
  std::vector<std::function<void()>> copies;  // issued TMA / bulk copies, landed by the first wait
};

struct NamedBarrier {
  int arrived = 0, expected = 0;
  uint64_t generation = 0;
};

struct CopyOp {
  void* dst;
  const void* src;
  int bytes;      // source bytes of the copy (the rest zero-filled)
  int size = 16;  // bytes written
  void land() const {
    std::memset(dst, 0, size);
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
};

struct Fiber {
  ucontext_t ctx;  // its start (makecontext); once started, jb holds where it is suspended
  jmp_buf jb;
  bool started = false;
  Op op = Op::kRun;
  // Operand and result of a shuffle or ballot; a shuffle reads lane src's operand.
  uint32_t in = 0, out = 0;
  int src = 0;
  // A kWarpFn collective: the function (the same in every lane) and this lane's operands.
  void (*warp_fn)(Fiber* lanes) = nullptr;
  const void* ptr = nullptr;
  uint32_t regs[6] = {};
  float* acc = nullptr;
  std::vector<CopyOp> open;
  std::deque<std::vector<CopyOp>> groups;
  WgmmaOperands wg;
  // The cluster barrier: arrived and not yet waited, at that generation.
  bool cluster_arrived = false;
  uint64_t cluster_generation = 0;
};

struct BlockState;

// The blocks of one thread block cluster, run together (launch), and its barrier.
struct ClusterState {
  std::vector<BlockState*> blocks;  // by rank
  int threads = 0, arrived = 0;
  uint64_t generation = 0;
};

struct BlockState {
  dim3 block_idx, grid_dim, block_dim;
  ClusterState* cluster = nullptr;
  int cluster_rank = 0;
  bool finished = false;  // every fiber has ended (a multicast into it is an error)
  std::vector<Fiber> fibers;
  std::vector<unsigned char> smem;
  unsigned char* window = nullptr;  // shared address 0, 1024-byte aligned (swizzles see the same bits)
  unsigned char* base = nullptr;    // the dynamic shared memory: window + dynamic_smem_offset()
  size_t offset = 0, smem_size = 0;
  std::map<uintptr_t, MbarState> mbar;  // by address
  NamedBarrier named[16];
  uint64_t epoch = 0;  // bumped by every arrival, phase flip or release: yields can progress
  ucontext_t sched;  // the scheduler, for a fiber's first entry only
  jmp_buf sched_jb;  // the scheduler, to return to from a fiber
  int current = -1;
  std::function<void()> body;
};

// Shared address where launch() starts the dynamic shared memory (a multiple of 16 below 1024;
// default 0).
inline size_t& dynamic_smem_offset() {
  static size_t offset = 0;
  return offset;
}

inline BlockState*& block() {
  static BlockState* b = nullptr;
  return b;
}

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "warp emulator: %s\n", what);
  std::abort();
}

inline Fiber& self() { return block()->fibers[block()->current]; }

inline void suspend(Op op) {
  Fiber& f = self();
  f.op = op;
  if (!_setjmp(f.jb)) _longjmp(block()->sched_jb, 1);
}

inline dim3 thread_idx() { return dim3((unsigned)block()->current, 0, 0); }

inline float bf16_lo(uint32_t u) {
  const uint32_t b = u << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline float bf16_hi(uint32_t u) {
  const uint32_t b = u & 0xffff0000u;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// One warp's collective, all 32 lanes arrived with the same op.
inline void run_warp_op(Fiber* lane, Op op) {
  switch (op) {
    case Op::kWarpSync:  // all 32 lanes arrived: nothing to compute
      break;
    case Op::kShfl:
      for (int l = 0; l < 32; l++) lane[l].out = lane[lane[l].src].in;
      break;
    case Op::kWarpFn:
      for (int l = 1; l < 32; l++)
        if (lane[l].warp_fn != lane[0].warp_fn) fail("warp collective: lanes at different instructions");
      lane[0].warp_fn(lane);
      break;
    case Op::kBallot: {
      uint32_t bits = 0;
      for (int l = 0; l < 32; l++) bits |= (lane[l].in ? 1u : 0u) << l;
      for (int l = 0; l < 32; l++) lane[l].out = bits;
      break;
    }
    default:
      fail("not a warp op");
  }
  for (int l = 0; l < 32; l++) lane[l].op = Op::kRun;
}

// Runs a warpgroup collective (set by wgmma_emulator.h; null when no kernel uses one).
inline void (*&warpgroup_op())(Fiber* lanes) {
  static void (*fn)(Fiber*) = nullptr;
  return fn;
}

// A fiber never returns: it ends by jumping back to the scheduler.
[[noreturn]] inline void fiber_entry() {
  block()->body();
  self().op = Op::kDone;
  _longjmp(block()->sched_jb, 1);
}

// This fiber's part of a kWarpFn collective: fn runs once every lane of its warp has arrived.
inline void warp_call(void (*fn)(Fiber*)) {
  self().warp_fn = fn;
  suspend(Op::kWarpFn);
}

// Whether TMA, bulk and cp.async copies land when issued (the earliest a real copy can: a write
// into shared memory that a block, or another block of its cluster, still reads shows) instead of
// at the first wait on their barrier or group (the latest: a read before the wait shows). A test
// runs a kernel both ways.
inline bool& land_copies_at_issue() {
  static bool at_issue = false;
  return at_issue;
}
// land_copies_at_issue() set for a scope (a test's runs), false again after it however it ends.
struct CopiesLanding {
  explicit CopiesLanding(bool at_issue) { land_copies_at_issue() = at_issue; }
  ~CopiesLanding() { land_copies_at_issue() = false; }
  CopiesLanding(const CopiesLanding&) = delete;
};

// One scheduling round of block b (block() == &b): its runnable fibers run until they suspend,
// then its warp and warpgroup collectives and barriers resolve. Returns whether anything
// progressed; *done when every fiber has ended.
inline bool run_round(BlockState& b, uint64_t& seen_epoch, bool* done) {
  const int n = (int)b.fibers.size();
  for (int i = 0; i < n; i++) {
    if (b.fibers[i].op != Op::kRun) continue;
    b.current = i;
    Fiber& f = b.fibers[i];
    if (!_setjmp(b.sched_jb)) {  // back here when the fiber suspends or ends
      if (f.started) _longjmp(f.jb, 1);
      f.started = true;
      swapcontext(&b.sched, &f.ctx);
    }
  }
  bool progress = false, all_done = true, all_sync = true;
  for (int w = 0; w < n / 32; w++) {
    Fiber* lane = &b.fibers[32 * w];
    const Op op = lane[0].op;
    bool same = true;
    for (int l = 0; l < 32; l++) same = same && lane[l].op == op;
    if (same && op != Op::kSync && op != Op::kDone && op != Op::kRun && op != Op::kWgmma && op != Op::kYield) {
      run_warp_op(lane, op);
      progress = true;
    }
  }
  for (int wgi = 0; wgi < n / 128; wgi++) {
    Fiber* lane = &b.fibers[128 * wgi];
    bool all = true;
    for (int l = 0; l < 128; l++) all = all && lane[l].op == Op::kWgmma;
    if (all) {
      if (!warpgroup_op()) fail("warpgroup op without wgmma_emulator.h");
      warpgroup_op()(lane);
      for (int l = 0; l < 128; l++) lane[l].op = Op::kRun;
      progress = true;
    }
  }
  // Waiters re-check their condition next round; only a changed barrier state is progress.
  bool any_yield = false;
  for (auto& f : b.fibers)
    if (f.op == Op::kYield) {
      f.op = Op::kRun;
      any_yield = true;
    }
  if (any_yield && b.epoch != seen_epoch) progress = true;
  seen_epoch = b.epoch;
  for (auto& f : b.fibers) {
    all_done = all_done && f.op == Op::kDone;
    all_sync = all_sync && f.op == Op::kSync;
  }
  if (all_sync && !all_done) {
    for (auto& f : b.fibers) f.op = Op::kRun;
    progress = true;
  }
  *done = all_done;
  return progress;
}

// Runs kernel(args...) over the grid, a thread block cluster (cluster blocks in x, y, z; 1 x 1 x 1:
// every block alone) at a time, each block's threads as fibers; a cluster's blocks run together,
// each in turn as far as it can, so they can wait on each other (the cluster barrier) and write
// each other's shared memory (multicast copies). Their static __shared__ variables are one copy: a clustered
// kernel keeps its own state in dynamic shared memory.
template <class... P, class... A>
void launch_cluster(void (*kernel)(P...), dim3 grid, dim3 cluster, dim3 blk, size_t smem_bytes, const A&... args) {
  if (blk.x % 32 != 0 || blk.y != 1 || blk.z != 1) fail("1-D blocks of whole warps only");
  if (cluster.x < 1 || cluster.y < 1 || cluster.z < 1 || grid.x % cluster.x || grid.y % cluster.y ||
      grid.z % cluster.z)
    fail("cluster dimensions must divide the grid's");
  if (cluster.x * cluster.y * cluster.z > 8) fail("a cluster of more than 8 blocks (the portable limit)");
  const size_t offset = dynamic_smem_offset();
  if (offset % 16 || offset >= 1024) fail("dynamic shared memory offset not a multiple of 16 below 1024");
  struct FlushSubnormals {  // FTZ | DAZ for the launch, restored however it ends
    unsigned csr = _mm_getcsr();
    FlushSubnormals() { _mm_setcsr(csr | 0x8040u); }
    ~FlushSubnormals() { _mm_setcsr(csr); }
  } flush;
  const unsigned per = cluster.x * cluster.y * cluster.z;
  std::vector<std::vector<char>> stacks(per * blk.x, std::vector<char>(64 * 1024));
  for (unsigned cz = 0; cz < std::max(grid.z, 1u) / cluster.z; cz++)
    for (unsigned cy = 0; cy < grid.y / cluster.y; cy++)
      for (unsigned cx = 0; cx < grid.x / cluster.x; cx++) {
        ClusterState cs;
        std::deque<BlockState> blocks;  // stable addresses
        for (unsigned r = 0; r < per; r++) {
          BlockState& b = blocks.emplace_back();
          const unsigned rx = r % cluster.x, ry = r / cluster.x % cluster.y, rz = r / (cluster.x * cluster.y);
          b.block_idx = dim3(cx * cluster.x + rx, cy * cluster.y + ry, cz * cluster.z + rz);
          b.grid_dim = grid;
          b.block_dim = blk;
          b.cluster = &cs;
          b.cluster_rank = (int)r;
          b.smem.assign(offset + smem_bytes + 1024 + 16, 0xff);  // NaN in bf16 and fp32
          b.window = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(b.smem.data()) + 1023) &
                                                      ~uintptr_t(1023));
          b.base = b.window + offset;
          b.offset = offset;
          b.smem_size = smem_bytes;
          b.body = [&] { kernel(args...); };
          b.fibers.resize(blk.x);
          for (unsigned i = 0; i < blk.x; i++) {
            Fiber& f = b.fibers[i];
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = stacks[r * blk.x + i].data();
            f.ctx.uc_stack.ss_size = stacks[r * blk.x + i].size();
            f.ctx.uc_link = &b.sched;
            makecontext(&f.ctx, fiber_entry, 0);
          }
          cs.blocks.push_back(&b);
          cs.threads += (int)blk.x;
        }
        std::vector<uint64_t> seen(per, 0), before(per, 0);
        // Each block runs as far as it can before the next gets a turn (in rank order): the blocks
        // of a cluster drift as far apart as their barriers allow, so a block that writes into a
        // peer's shared memory too early (a missing cluster barrier) overwrites what the peer has
        // not read yet.
        for (;;) {
          // Progress is any block's: a block's round can wake a peer (a multicast; the cluster
          // barrier bumps every block's epoch) and then end without moving on itself.
          for (unsigned r = 0; r < per; r++) before[r] = cs.blocks[r]->epoch;
          bool progress = false, all_done = true;
          for (unsigned r = 0; r < per; r++) {
            BlockState& b = *cs.blocks[r];
            block() = &b;
            while (!b.finished) {
              bool done = false;
              const bool moved = run_round(b, seen[r], &done);
              b.finished = done;
              if (!moved && !done) break;
              progress = true;
            }
            all_done = all_done && b.finished;
          }
          block() = nullptr;
          if (all_done) break;
          for (unsigned r = 0; r < per; r++) progress = progress || cs.blocks[r]->epoch != before[r];
          if (!progress) fail("deadlock: warps at different collectives or barriers, or a warp op after exit");
        }
      }
}

// Runs kernel(args...) over the grid, block by block, each block's threads as fibers.
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 blk, size_t smem_bytes, const A&... args) {
  launch_cluster(kernel, grid, dim3(1, 1, 1), blk, smem_bytes, args...);
}

}  // namespace tt::cuda::emu

// ---- the CUDA names the kernels use ----
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static  // one copy for the block's fibers (blocks run one after another; see launch_cluster)
#define __forceinline__ inline
#define __launch_bounds__(...)
#define TT_EXTERN_SMEM_16(name) unsigned char* const name = ::tt::cuda::emu::block()->base
#define threadIdx (::tt::cuda::emu::thread_idx())
#define blockIdx (::tt::cuda::emu::block()->block_idx)
#define gridDim (::tt::cuda::emu::block()->grid_dim)
#define blockDim (::tt::cuda::emu::block()->block_dim)

inline void __syncthreads() { ::tt::cuda::emu::suspend(::tt::cuda::emu::Op::kSync); }

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) == 4, "32-bit shuffles");
  if (mask != 0xffffffffu) ::tt::cuda::emu::fail("partial-warp shuffle");
  auto& f = ::tt::cuda::emu::self();
  std::memcpy(&f.in, &v, 4);
  f.src = (int)(threadIdx.x % 32) ^ lane_mask;
  ::tt::cuda::emu::suspend(::tt::cuda::emu::Op::kShfl);
  T r;
  std::memcpy(&r, &f.out, 4);
  return r;
}

// Lane (lane - delta)'s v; lanes below delta keep their own.
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta) {
  const int lane = (int)(threadIdx.x % 32);
  return __shfl_xor_sync(mask, v, lane ^ (lane >= (int)delta ? lane - (int)delta : lane));
}

// Lane src_lane's v, as the xor shuffle whose mask takes each lane to src_lane.
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src_lane) {
  return __shfl_xor_sync(mask, v, (int)(threadIdx.x % 32) ^ src_lane);
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
  if (mask != 0xffffffffu) ::tt::cuda::emu::fail("partial-warp ballot");
  auto& f = ::tt::cuda::emu::self();
  f.in = pred ? 1u : 0u;
  ::tt::cuda::emu::suspend(::tt::cuda::emu::Op::kBallot);
  return f.out;
}

using std::max;  // CUDA's min and max of two ints or floats
using std::min;
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
// The GPU's is ex2.approx(x log2 e) (2 ulp + 2^-21 relative), subnormal results flushed.
inline float __expf(float x) {
  const float r = std::exp(x);
  return std::fpclassify(r) == FP_SUBNORMAL ? 0.f : r;
}
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }  // the GPU's: 2 ulp
inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

namespace tt::cuda::attn {

inline unsigned char* dynamic_smem() { return ::tt::cuda::emu::block()->base; }

// The shared-window address of p: its offset in the block's shared memory.
inline uint32_t smem_addr(const void* p) {
  auto& b = *::tt::cuda::emu::block();
  const auto* s = static_cast<const unsigned char*>(p);
  if (s < b.base || s > b.base + b.smem_size) ::tt::cuda::emu::fail("shared address outside the block's smem");
  return (uint32_t)(s - b.window);
}

// A cp.async of `size` bytes (the first src_bytes copied, the rest zero-filled), deferred to the
// wait that covers it, or with land_copies_at_issue() copied now (its group's wait then has
// nothing left to land).
template <int kSize>
inline void cp_async(void* smem, const void* gmem, int src_bytes) {
  auto& b = *::tt::cuda::emu::block();
  if (src_bytes < 0 || src_bytes > kSize) ::tt::cuda::emu::fail("cp.async source bytes outside [0, size]");
  const auto* s = static_cast<unsigned char*>(smem);
  if (s < b.base || s + kSize > b.base + b.smem_size) ::tt::cuda::emu::fail("cp.async outside smem");
  if ((reinterpret_cast<uintptr_t>(smem) % kSize) || (src_bytes > 0 && (reinterpret_cast<uintptr_t>(gmem) % kSize)))
    ::tt::cuda::emu::fail("cp.async address not aligned to its size");
  const ::tt::cuda::emu::CopyOp c{smem, gmem, src_bytes, kSize};
  if (::tt::cuda::emu::land_copies_at_issue())
    c.land();
  else
    ::tt::cuda::emu::self().open.push_back(c);
}
inline void cp_async_16(void* smem, const void* gmem, int src_bytes) { cp_async<16>(smem, gmem, src_bytes); }
inline void cp_async_4(void* smem, const void* gmem, int src_bytes) { cp_async<4>(smem, gmem, src_bytes); }

inline void cp_async_commit() {
  auto& f = ::tt::cuda::emu::self();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}

template <int kPending>
inline void cp_async_wait() {
  auto& f = ::tt::cuda::emu::self();
  while ((int)f.groups.size() > kPending) {
    for (const auto& c : f.groups.front()) c.land();
    f.groups.pop_front();
  }
}

inline uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

inline void store_bf16x2(__nv_bfloat16* dst, float x, float y) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  std::memcpy(static_cast<void*>(dst), &v, 4);
}

inline void add_f32x2(float* dst, float x, float y) {
  dst[0] += x;
  dst[1] += y;
}

inline float dot_bf16x2(const __nv_bfloat16* a, const __nv_bfloat16* b) {
  __nv_bfloat162 x, y;
  std::memcpy(static_cast<void*>(&x), a, 4);
  std::memcpy(static_cast<void*>(&y), b, 4);
  const float2 fx = __bfloat1622float2(x), fy = __bfloat1622float2(y);
  return fx.x * fy.x + fx.y * fy.y;
}

}  // namespace tt::cuda::attn
