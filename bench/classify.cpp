// classify() on the host: spans to structure for the masks frameworks pass, beside the
// classifier before the fast path (bench/classify_before.hpp) run on the same tables in
// the same process. The tables are built from structures directly (no scan): this
// measures the classifier alone. Median of many calls per case; the verdicts of the two
// must be identical, or the program says so and fails.
#include <masklens/masklens.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace masklens::before {
Result<MaskStructure> classify_baseline(const SpanTable& table);
}

using namespace masklens;
using bench::median_us;
using bench::table_of;

namespace {

constexpr bench::TimeBudget kBudget{400, 2001, 0.1};

}  // namespace

// Usage: classify [substring]: only the cases whose name holds it (for a profiler).
int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  constexpr std::int64_t L = 69632;
  struct Case {
    std::string name;
    SpanTable table;
  };
  std::vector<Case> cases;

  MaskStructure causal = make_structure(StructureKind::causal, 1, L, L);
  cases.push_back({"causal 69632", table_of(causal, false)});
  MaskStructure causal8 = make_structure(StructureKind::causal, 8, L, L);
  cases.push_back({"causal 69632, batch 8 stride 0", table_of(causal8, true)});
  MaskStructure window = make_structure(StructureKind::sliding_window, 1, L, L);
  window.window = 4096;
  cases.push_back({"sliding window 4096, 69632", table_of(window, false)});
  MaskStructure packed = causal;
  packed.segments = {{0, 20000, 45000, L}};
  cases.push_back({"3 packed documents, 69632", table_of(packed, false)});

  constexpr std::int64_t P = 8192;
  MaskStructure right = make_structure(StructureKind::causal, 8, P, P);
  MaskStructure left = right;
  for (std::int64_t b = 0; b < 8; ++b) {
    const std::int64_t pad = b == 0 ? 0 : 512 * b + 37;  // the longest sequence has no padding
    right.kv_valid.push_back({0, P - pad});
    left.kv_valid.push_back({pad, P});
  }
  cases.push_back({"right-padded causal 8 x 8192", table_of(right, false)});
  cases.push_back({"left-padded causal 8 x 8192", table_of(left, false)});

  MaskStructure decode = make_structure(StructureKind::full, 64, 1, P);
  for (std::int64_t b = 0; b < 64; ++b) decode.kv_valid.push_back({b == 0 ? 0 : 97 * b, P});
  cases.push_back({"decode [64, 1, 1, 8192], left padding", table_of(decode, false)});

  // Random intervals: every row a span (so every candidate is fitted), no structure.
  SpanTable noise;
  noise.batch = noise.heads = noise.distinct_batch = noise.distinct_heads = 1;
  noise.q_len = noise.k_len = 16384;
  std::mt19937_64 rng(12);
  for (std::int64_t q = 0; q < noise.q_len; ++q) {
    const std::int64_t a = static_cast<std::int64_t>(rng() % 16384), b = static_cast<std::int64_t>(rng() % 16384);
    noise.rows.push_back(RowSpan::interval(std::min(a, b), std::max(a, b)));
  }
  cases.push_back({"arbitrary (random intervals) 16384", noise});

  bool same = true;
  std::printf("%-40s %12s %12s %8s  %s\n", "case", "before", "classify", "speedup", "verdict");
  for (const Case& c : cases) {
    if (c.name.find(only) == std::string::npos) continue;
    const Result<MaskStructure> old_verdict = before::classify_baseline(c.table);
    const Result<MaskStructure> new_verdict = classify(c.table);
    if (!old_verdict.ok() || !new_verdict.ok()) {
      std::printf("%-40s classify failed\n", c.name.c_str());
      return 1;
    }
    const std::string text = describe(*new_verdict);
    if (describe(*old_verdict) != text) {
      std::printf("%-40s verdicts differ:\n  before %s\n  now    %s\n", c.name.c_str(), describe(*old_verdict).c_str(),
                  text.c_str());
      same = false;
    }
    volatile std::size_t sink = 0;
    const double t_old = median_us(kBudget, [&] { sink = sink + before::classify_baseline(c.table)->kv_valid.size(); });
    const double t_new = median_us(kBudget, [&] { sink = sink + classify(c.table)->kv_valid.size(); });
    std::printf("%-40s %9.1f us %9.1f us %7.1fx  %.60s\n", c.name.c_str(), t_old, t_new, t_old / t_new, text.c_str());
  }
  return same ? 0 : 1;
}
