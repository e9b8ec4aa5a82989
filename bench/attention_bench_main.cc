// attention_bench: times the CUDA tree attention on a public workload and prints one JSON line.
//
//   attention_bench --workload comb|rollout|agent_short|causal|comb_short|trunk [--n N (causal)] [--heads 16]
//                   [--kv-heads 16] [--head-dim 128] [--iters 10] [--warmup 3] [--child-order largest|listed]
//                   [--dump PREFIX]
// Workloads: trainer/attention_bench.h (workload_tree).
// --child-order: the layout's preorder (data::Tree::preorder): largest, what training packs, or
// listed, the children in index order (the layout before 2026-12-03), for comparisons.
// --dump writes PREFIXsubtree_end.npy and PREFIXpos.npy for scripts/device/attention_compare.py.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "trainer/attention_bench.h"
#include "base/check.h"

int main(int argc, char** argv) {
  try {
    tt::trainer::AttentionBenchOptions opt;
    std::string workload = "comb", dump;
    tt::data::ChildOrder order = tt::data::ChildOrder::kLargestFirst;
    int n = 16384;
    for (int i = 1; i < argc; i++) {
      const std::string a = argv[i];
      TT_CHECK(i + 1 < argc, "attention_bench: ", a, " needs a value");
      const char* val = argv[++i];
      if (a == "--workload") workload = val;
      else if (a == "--n") n = std::atoi(val);
      else if (a == "--heads") opt.heads = std::atoi(val);
      else if (a == "--kv-heads") opt.kv_heads = std::atoi(val);
      else if (a == "--head-dim") opt.head_dim = std::atoi(val);
      else if (a == "--iters") opt.iters = std::atoi(val);
      else if (a == "--warmup") opt.warmup = std::atoi(val);
      else if (a == "--dump") dump = val;
      else if (a == "--child-order") {
        TT_CHECK(std::strcmp(val, "largest") == 0 || std::strcmp(val, "listed") == 0, "attention_bench: --child-order ",
                 val, ", expected largest or listed");
        order = std::strcmp(val, "largest") == 0 ? tt::data::ChildOrder::kLargestFirst : tt::data::ChildOrder::kListed;
      }
      else TT_CHECK(false, "attention_bench: unknown option ", a);
    }
    const tt::data::PackedBatch batch = tt::trainer::pack_one(tt::trainer::workload_tree(workload, n), order);
    if (!dump.empty()) tt::trainer::dump_layout_npy(batch, dump);
    const bool listed = order == tt::data::ChildOrder::kListed;
    const auto r = tt::trainer::bench_attention(batch, listed ? workload + ":listed" : workload, opt);
    std::string json = tt::trainer::to_json(r);
    if (!dump.empty()) json.insert(json.size() - 1, ", \"layout\": \"" + dump + "\"");
    std::printf("%s\n", json.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
}
