// decide() latency on this CPU: median over many calls for typical structures, beside
// the cost of copying the structure (the baseline a caller pays anyway).
#include <masklens/masklens.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

using namespace masklens;

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
  AttentionCall call;
  call.head_dim = 256;
  call.heads = 4;
  call.training = true;
  struct Case {
    const char* name;
    MaskStructure s;
  };
  std::vector<Case> cases;
  MaskStructure causal;
  causal.q_len = causal.k_len = 69632;
  causal.kind = StructureKind::causal;
  cases.push_back({"causal 69632 (seed)", causal});
  MaskStructure padded = causal;
  padded.batch = 2;
  padded.kv_valid = {{0, 69632}, {0, 50000}};
  cases.push_back({"right-padded causal, plan", padded});
  MaskStructure window = causal;
  window.kind = StructureKind::sliding_window;
  window.window = 4096;
  cases.push_back({"sliding window, dense", window});
  volatile std::size_t sink = 0;
  for (const Case& c : cases) {
    const double copy = median_ns([&] { MaskStructure x = c.s; sink = sink + x.kv_valid.size(); });
    const double ns = median_ns([&] { auto p = decide(c.s, call); sink = sink + p->rejected.size(); });
    std::printf("%-28s decide %8.0f ns   (structure copy %5.0f ns)\n", c.name, ns, copy);
  }
  return 0;
}
