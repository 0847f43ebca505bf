// classify on the host from rows and from runs: classify(SpanTable) beside
// classify(SpanRuns) on the same masks in the same process, and encode() (the host's
// way to the runs; on the GPU they are reduced on the device). Tables are built from
// structures directly (no scan). Median of many calls per case; the verdicts must be
// identical, field for field, or the program says so and fails. Built by
// bench/classify_against.sh REF, REF's classify(SpanRuns) is timed beside this tree's on
// the same runs ("baseline"), and its verdicts must be identical too.
#include <masklens/classify_runs.hpp>
#include <masklens/masklens.hpp>
#include <masklens/span_runs.hpp>

#include <algorithm>
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
using bench::table_of;

namespace {

constexpr bench::TimeBudget kBudget{300, 20001, 0.05};

}  // namespace

// Usage: classify_runs [substring]: only the cases whose name holds it.
int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  // classify's masks, and more that reduce to few runs: left padding and a prefix at
  // 69632, a thousand packed documents, random intervals held for 16 rows each.
  std::vector<bench::TableCase> cases = bench::classify_cases();
  constexpr std::int64_t L = 69632;
  const MaskStructure causal = make_structure(StructureKind::causal, 1, L, L);
  MaskStructure left = causal;
  left.kv_valid = {{1234, L}};
  cases.push_back({"left-padded causal 69632", table_of(left, false)});
  MaskStructure prefix = make_structure(StructureKind::prefix_lm, 1, L, L);
  prefix.prefix = 1000;
  cases.push_back({"prefix-LM 1000, 69632", table_of(prefix, false)});
  MaskStructure many = causal;  // documents of 70 rows on average
  many.segments = {{0}};
  for (std::int64_t x = 1; x < 1000; ++x) many.segments[0].push_back(x * L / 1000 + x % 7);
  many.segments[0].push_back(L);
  cases.push_back({"1000 packed documents, 69632", table_of(many, false)});
  cases.push_back({"random intervals, 16 rows each, 16384", bench::random_intervals(16384, 16, 13)});

  bool same = true;
  std::printf("%-40s %6s %12s %12s %14s %8s  %s\n", "case", "runs", "from rows", "encode", "from runs", "speedup",
              "verdict");
  for (const bench::TableCase& c : cases) {
    if (c.name.find(only) == std::string::npos) continue;
    const Result<SpanRuns> runs = SpanRuns::encode(c.table);
    RunsClassifyStats stats;
    const Result<MaskStructure> by_rows = classify(c.table), by_runs = runs ? classify(*runs, &stats) : runs.status();
    if (!by_rows.ok() || !by_runs.ok()) {
      std::printf("%-40s classify failed\n", c.name.c_str());
      return 1;
    }
    if (testing::structure_fields(*by_rows) != testing::structure_fields(*by_runs)) {
      std::printf("%-40s verdicts differ:\n  rows %s\n  runs %s\n", c.name.c_str(), describe(*by_rows).c_str(),
                  describe(*by_runs).c_str());
      same = false;
    }
    volatile std::size_t sink = 0;
    double t_old = -1;  // the baseline's from runs (built with one)
#ifdef MASKLENS_BASELINE
    const auto old_table = classify_baseline::load(c.table);
    if (classify_baseline::has_runs()) {
      const std::string old_fields = classify_baseline::verdict_from_runs(*old_table);
      if (old_fields != testing::structure_fields(*by_runs)) {
        std::printf("%-40s verdicts differ:\n  baseline %s\n  now      %s\n", c.name.c_str(), old_fields.c_str(),
                    testing::structure_fields(*by_runs).c_str());
        same = false;
      }
      t_old = median_us(kBudget, [&] { sink = sink + classify_baseline::classify_runs(*old_table); });
    }
#endif
    const double t_rows = median_us(kBudget, [&] { sink = sink + classify(c.table)->kv_valid.size(); });
    const double t_encode = median_us(kBudget, [&] { sink = sink + SpanRuns::encode(c.table)->runs.size(); });
    const double t_runs = median_us(kBudget, [&] { sink = sink + classify(*runs)->kv_valid.size(); });
    std::printf("%-40s %6zu %9.1f us %9.1f us %11.2f us %7.0fx  %.50s%s\n", c.name.c_str(), runs->runs.size(), t_rows,
                t_encode, t_runs, t_rows / t_runs, describe(*by_runs).c_str(), stats.expanded ? " (expanded)" : "");
    if (t_old >= 0) std::printf("%-40s %6s %12s %12s %11.2f us  (baseline, from runs)\n", "", "", "", "", t_old);
  }
  return same ? 0 : 1;
}
