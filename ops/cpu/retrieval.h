// Segment retrieval, CPU reference (model/segments.h): the top-R selection of a detached KV pool
// for a segment's long-range heads, and the gather of the selected rows into an external prefix.
//
// Score of pool row j for long-range KV head g: the sum over g's query heads h (g G .. g G + G -
// 1, G = NH / NKV) of q_h . k_{j,g}, with q the end query of the previous segment and k the pool's
// keys, both without RoPE (content, not position: the pool spans the whole history while
// positions restart every segment). fp64 sums over h, then d, in order. The R rows of highest
// score are kept, ties going to the lower row (the earlier position), and listed in increasing
// row order (the order they held in the sequence).
#pragma once
#include <cstdint>

namespace tt::cpu {

// The pool keeps the long-range heads only: a pool row is (NL, HS), NL = popcount(heads), slot s
// holding the s-th KV head of `heads` in increasing order (pool_slot).
inline int pool_slot(uint64_t heads, int g) { return __builtin_popcountll(heads & ((uint64_t{1} << g) - 1)); }

// idx (NKV, R): for each KV head g in `heads` (bit g), its R selected rows, ascending; rows of
// the other heads are -1. q (NH, HS); pool_k (P, NL, HS); 0 <= R <= P.
template <class T>
void retrieval_select(int32_t* idx, const T* q, const T* pool_k, int P, int NH, int NKV, int HS, uint64_t heads,
                      int R);

// out (R, NKV, HS): head g's slice of row r is pool row idx[g][r]'s slot pool_slot(heads, g) for
// g in `heads`, zero for the other heads (which never read the prefix). pool (P, NL, HS).
template <class T>
void retrieval_gather(T* out, const T* pool, const int32_t* idx, int R, int NKV, int HS, uint64_t heads);

}  // namespace tt::cpu
