// classify() on the host: spans to structure for the masks frameworks pass, beside the
// classifier before the fast path (bench/classify_before.hpp) run on the same tables in
// the same process. The tables are built from structures directly (no scan): this
// measures the classifier alone. Median of many calls per case; the verdicts of the two
// must be identical, or the program says so and fails.
#include <masklens/masklens.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
  const std::vector<bench::TableCase> cases = bench::classify_cases();

  bool same = true;
  std::printf("%-40s %12s %12s %8s  %s\n", "case", "before", "classify", "speedup", "verdict");
  for (const bench::TableCase& c : cases) {
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
