// decide() latency on this CPU: median over many calls for typical structures, beside
// the cost of copying the structure (the baseline a caller pays anyway), and the heap
// allocations one call makes beside those its result holds.
#include <masklens/masklens.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "../tests/support/allocation_count.hpp"
#include "../tests/support/calls.hpp"

using namespace masklens;
using masklens::testing::g_allocations;
using masklens::testing::owned_blocks;

namespace {

template <class F>
double median_ns(F&& f, int reps = 2000) {
  std::vector<double> t;
  t.reserve(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main() {
  const Environment torch_only = testing::h200();
  const Environment everything = with_every_family(torch_only);
  Environment unversioned = torch_only;  // every family available, none installed: all refuse
  unversioned.available = kEveryFamily;

  struct Case {
    const char* name;
    MaskStructure s;
    Environment env;
  };
  MaskStructure causal;
  causal.q_len = causal.k_len = 69632;
  causal.kind = StructureKind::causal;
  MaskStructure padded = causal;
  padded.batch = 2;
  padded.kv_valid = {{0, 69632}, {0, 50000}};
  MaskStructure window = causal;
  window.kind = StructureKind::sliding_window;
  window.window = 4096;
  MaskStructure docs = causal;
  docs.batch = 2;
  docs.segments = {{0, 1000, 30000, 69632}, {0, 69632}};
  Environment with_flex = torch_only;  // flex offered: an exact structure's tiles are counted when flex may win
  with_flex.available |= kFamilyFlex;
  MaskStructure block_sparse = causal;
  block_sparse.kind = StructureKind::arbitrary;
  block_sparse.tile_fractions = TileFractions{128, 128, 0.1, 0.2};
  const Case cases[] = {
      {"causal 69632 (seed), torch", causal, torch_only},
      {"causal 69632, all families", causal, everything},
      {"causal 69632, families w/o versions", causal, unversioned},
      {"packed docs, all families (varlen)", docs, everything},
      {"right-padded causal, torch plan", padded, torch_only},
      {"sliding window, torch varlen", window, torch_only},
      {"sliding window, torch + flex (tiles)", window, with_flex},
      {"causal 69632, torch + flex", causal, with_flex},
      {"arbitrary with tile shares, flex", block_sparse, with_flex},
  };
  const AttentionCall call = testing::seed_call();
  volatile std::size_t sink = 0;
  std::printf("%-38s %10s %10s %8s %8s\n", "case", "decide", "copy", "allocs", "in result");
  for (const Case& c : cases) {
    const double copy = median_ns([&] { MaskStructure x = c.s; sink = sink + x.kv_valid.size(); });
    const double ns = median_ns([&] { auto p = decide(c.s, call, c.env); sink = sink + p->rejected.size(); });
    const long before = g_allocations.load();
    const Result<Policy> p = decide(c.s, call, c.env);
    const long allocations = g_allocations.load() - before;
    std::printf("%-38s %7.0f ns %7.0f ns %8ld %8ld\n", c.name, ns, copy, allocations, p ? owned_blocks(*p) : -1L);
  }
  return 0;
}
