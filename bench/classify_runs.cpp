// classify on the host from rows and from runs: classify(SpanTable) beside
// classify(SpanRuns) on the same masks in the same process, and encode() (the host's
// way to the runs; on the GPU they are reduced on the device). Tables are built from
// structures directly (no scan). Median of many calls per case; the verdicts must be
// identical, field for field, or the program says so and fails.
#include <masklens/classify_runs.hpp>
#include <masklens/masklens.hpp>
#include <masklens/span_runs.hpp>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../tests/support/structure_fields.hpp"
#include "bench_support.hpp"

using namespace masklens;
using bench::median_us;
using bench::table_of;

namespace {

constexpr bench::TimeBudget kBudget{300, 20001, 0.05};

}  // namespace

// Usage: classify_runs [substring]: only the cases whose name holds it.
int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  constexpr std::int64_t L = 69632;
  struct Case {
    std::string name;
    SpanTable table;
  };
  std::vector<Case> cases;
  const MaskStructure causal = make_structure(StructureKind::causal, 1, L, L);
  cases.push_back({"causal 69632", table_of(causal, false)});
  cases.push_back({"causal 69632, batch 8 stride 0", table_of(make_structure(StructureKind::causal, 8, L, L), true)});
  MaskStructure window = make_structure(StructureKind::sliding_window, 1, L, L);
  window.window = 4096;
  cases.push_back({"sliding window 4096, 69632", table_of(window, false)});
  MaskStructure packed = causal;
  packed.segments = {{0, 20000, 45000, L}};
  cases.push_back({"3 packed documents, 69632", table_of(packed, false)});
  MaskStructure left = causal;
  left.kv_valid = {{1234, L}};
  cases.push_back({"left-padded causal 69632", table_of(left, false)});
  MaskStructure prefix = make_structure(StructureKind::prefix_lm, 1, L, L);
  prefix.prefix = 1000;
  cases.push_back({"prefix-LM 1000, 69632", table_of(prefix, false)});
  constexpr std::int64_t P = 8192;
  MaskStructure right8 = make_structure(StructureKind::causal, 8, P, P), left8 = right8;
  for (std::int64_t b = 0; b < 8; ++b) {
    const std::int64_t pad = b == 0 ? 0 : 512 * b + 37;
    right8.kv_valid.push_back({0, P - pad});
    left8.kv_valid.push_back({pad, P});
  }
  cases.push_back({"right-padded causal 8 x 8192", table_of(right8, false)});
  cases.push_back({"left-padded causal 8 x 8192", table_of(left8, false)});
  MaskStructure decode = make_structure(StructureKind::full, 64, 1, P);
  for (std::int64_t b = 0; b < 64; ++b) decode.kv_valid.push_back({b == 0 ? 0 : 97 * b, P});
  cases.push_back({"decode [64, 1, 1, 8192], left padding", table_of(decode, false)});
  MaskStructure many = causal;  // documents of 70 rows on average
  many.segments = {{0}};
  for (std::int64_t x = 1; x < 1000; ++x) many.segments[0].push_back(x * L / 1000 + x % 7);
  many.segments[0].push_back(L);
  cases.push_back({"1000 packed documents, 69632", table_of(many, false)});
  // Random intervals held for 16 rows each: a run per 16 rows, no structure.
  SpanTable blocks;
  blocks.batch = blocks.heads = blocks.distinct_batch = blocks.distinct_heads = 1;
  blocks.q_len = blocks.k_len = 16384;
  std::mt19937_64 block_rng(13);
  for (std::int64_t q = 0; q < blocks.q_len; q += 16) {
    const auto a = static_cast<std::int64_t>(block_rng() % 16384), b = static_cast<std::int64_t>(block_rng() % 16384);
    for (int i = 0; i < 16; ++i) blocks.rows.push_back(RowSpan::interval(std::min(a, b), std::max(a, b)));
  }
  cases.push_back({"random intervals, 16 rows each, 16384", blocks});
  SpanTable noise;
  noise.batch = noise.heads = noise.distinct_batch = noise.distinct_heads = 1;
  noise.q_len = noise.k_len = 16384;
  std::mt19937_64 rng(12);
  for (std::int64_t q = 0; q < noise.q_len; ++q) {
    const auto a = static_cast<std::int64_t>(rng() % 16384), b = static_cast<std::int64_t>(rng() % 16384);
    noise.rows.push_back(RowSpan::interval(std::min(a, b), std::max(a, b)));
  }
  cases.push_back({"arbitrary (random intervals) 16384", noise});

  bool same = true;
  std::printf("%-40s %6s %12s %12s %14s %8s  %s\n", "case", "runs", "from rows", "encode", "from runs", "speedup",
              "verdict");
  for (const Case& c : cases) {
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
    const double t_rows = median_us(kBudget, [&] { sink = sink + classify(c.table)->kv_valid.size(); });
    const double t_encode = median_us(kBudget, [&] { sink = sink + SpanRuns::encode(c.table)->runs.size(); });
    const double t_runs = median_us(kBudget, [&] { sink = sink + classify(*runs)->kv_valid.size(); });
    std::printf("%-40s %6zu %9.1f us %9.1f us %11.2f us %7.0fx  %.50s%s\n", c.name.c_str(), runs->runs.size(), t_rows,
                t_encode, t_runs, t_rows / t_runs, describe(*by_runs).c_str(), stats.expanded ? " (expanded)" : "");
  }
  return same ? 0 : 1;
}
