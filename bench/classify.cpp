// classify() on the host: spans to structure for the masks frameworks pass. The tables
// are built from structures directly (no scan): this measures the classifier alone.
// Median of many calls per case. Built by bench/classify_against.sh REF, the classifier
// of REF runs beside this one on the same tables in the same process, calls alternating
// case by case, and the program fails if a verdict differs in any field.
#include <masklens/masklens.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "../tests/support/structure_fields.hpp"
#include "bench_support.hpp"
#ifdef MASKLENS_BASELINE
#include "classify_baseline.hpp"
#endif

using namespace masklens;
using bench::median_us;

namespace {

constexpr bench::TimeBudget kBudget{400, 2001, 0.1};

}  // namespace

// Usage: classify [substring]: only the cases whose name holds it (for a profiler).
int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  bool same = true;
#ifdef MASKLENS_BASELINE
  std::printf("%-40s %12s %12s %8s  %s\n", "case", "baseline", "classify", "speedup", "verdict");
#else
  std::printf("%-40s %12s  %s\n", "case", "classify", "verdict");
#endif
  for (const bench::TableCase& c : bench::classify_cases()) {
    if (c.name.find(only) == std::string::npos) continue;
    const Result<MaskStructure> verdict = classify(c.table);
    if (!verdict.ok()) {
      std::printf("%-40s classify failed\n", c.name.c_str());
      return 1;
    }
    volatile std::size_t sink = 0;
#ifdef MASKLENS_BASELINE
    const auto old_table = classify_baseline::load(c.table);
    const std::string old_fields = classify_baseline::verdict(*old_table);
    if (old_fields != testing::structure_fields(*verdict)) {
      std::printf("%-40s verdicts differ:\n  baseline %s\n  now      %s\n", c.name.c_str(), old_fields.c_str(),
                  testing::structure_fields(*verdict).c_str());
      same = false;
    }
    const double t_old = median_us(kBudget, [&] { sink = sink + classify_baseline::classify_rows(*old_table); });
    const double t_new = median_us(kBudget, [&] { sink = sink + classify(c.table)->kv_valid.size(); });
    std::printf("%-40s %9.1f us %9.1f us %7.2fx  %.60s\n", c.name.c_str(), t_old, t_new, t_old / t_new,
                describe(*verdict).c_str());
#else
    const double t_new = median_us(kBudget, [&] { sink = sink + classify(c.table)->kv_valid.size(); });
    std::printf("%-40s %9.1f us  %.60s\n", c.name.c_str(), t_new, describe(*verdict).c_str());
#endif
  }
  return same ? 0 : 1;
}
