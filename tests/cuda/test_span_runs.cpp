// The device's run reduction against the host's encoding (the oracle: SpanRuns::encode)
// run for run, on random span tables of every size the tiling meets (one row, a tile, a
// row past a tile, more tiles than one block of the prefix kernel walks at once), and on
// scanned masks of every kind; inspect_runs() against inspect(); and the contract of
// scan.hpp: two-phase on the caller's stream with no synchronisation inside (it records
// into a CUDA graph), argument errors named, the caller's pending CUDA error neither
// cleared nor taken for ours. Plain C++: the CUDA runtime API and masklens/cuda/runs.hpp.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>
#include <masklens/cuda/runs.hpp>
#include <masklens/cuda/agent_runs.hpp>  // the kernels' tile and pass sizes, for the edges below
#include <masklens/cuda/scan.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../support/device_buffer.hpp"
#include "../support/mask_gen.hpp"
#include "../support/structure_fields.hpp"
#include "suite_size.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

// The first row flagged kRowInvalid, -1 where none is: what reduce_runs reports.
std::int64_t first_flagged_row(const SpanTable& t) {
  for (std::size_t i = 0; i < t.rows.size(); ++i)
    if (t.rows[i].flags & kRowInvalid) return static_cast<std::int64_t>(i);
  return -1;
}

// reduce_runs on the table's rows with room for `room` runs (0: one per row, the most
// there can be), on `stream`, back on the host; *count_out gets the count. The first
// invalid row it reports is checked against the table's.
SpanRuns device_runs(const SpanTable& t, cudaStream_t stream = nullptr, std::int64_t room = 0,
                     std::int64_t* count_out = nullptr) {
  const auto rows = static_cast<std::int64_t>(t.rows.size());
  if (room == 0) room = rows;
  DeviceBuffer d_rows(t.rows.size() * sizeof(RowSpan)), d_runs(static_cast<std::size_t>(room) * sizeof(SpanRun)),
      d_count(2 * sizeof(std::int64_t));
  REQUIRE_CUDA(cudaMemcpy(d_rows.get(), t.rows.data(), t.rows.size() * sizeof(RowSpan), cudaMemcpyHostToDevice));
  // Leftovers must not pass for results.
  REQUIRE_CUDA(cudaMemset(d_runs.get(), 0xab, static_cast<std::size_t>(room) * sizeof(SpanRun)));
  REQUIRE_CUDA(cudaMemset(d_count.get(), 0xab, 2 * sizeof(std::int64_t)));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  std::size_t temp_bytes = 0;
  REQUIRE(gpu::reduce_runs(nullptr, temp_bytes, nullptr, rows, t.q_len, nullptr, 1, nullptr, nullptr, stream).ok());
  // Storage 3 bytes past the allocation's start: any address will do.
  DeviceBuffer temp(temp_bytes + 3);
  const Status st = gpu::reduce_runs(temp.get() + 3, temp_bytes, d_rows.get<RowSpan>(), rows, t.q_len,
                                     d_runs.get<SpanRun>(), room, d_count.get<std::int64_t>(),
                                     d_count.get<std::int64_t>() + 1, stream);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  std::int64_t head[2] = {-1, -2};
  REQUIRE_CUDA(cudaMemcpyAsync(head, d_count.get(), sizeof head, cudaMemcpyDeviceToHost, stream));
  REQUIRE_CUDA(cudaStreamSynchronize(stream));
  const std::int64_t count = head[0];
  REQUIRE(head[1] == first_flagged_row(t));
  REQUIRE(count >= 1);
  REQUIRE(count <= rows);
  if (count_out) *count_out = count;
  SpanRuns out = SpanRuns::shape_of(t);
  out.runs.resize(static_cast<std::size_t>(std::min(count, room)));
  REQUIRE_CUDA(cudaMemcpy(out.runs.data(), d_runs.get(), out.runs.size() * sizeof(SpanRun), cudaMemcpyDeviceToHost));
  return out;
}

void require_same_runs(const SpanRuns& host, const SpanRuns& device) {
  REQUIRE(host.runs.size() == device.runs.size());
  for (std::size_t k = 0; k < host.runs.size(); ++k) {
    const SpanRun& a = host.runs[k];
    const SpanRun& b = device.runs[k];
    INFO("run " << k << ": host row " << a.row << " length " << a.length << ", device row " << b.row << " length "
                << b.length);
    REQUIRE(a == b);
  }
}

RowSpan random_row(Rng& rng, std::int64_t k_len) {
  RowSpan r;
  switch (uniform(rng, 0, 4)) {
    case 0: break;
    case 1: {
      const std::int64_t a = uniform(rng, 0, k_len - 1), b = uniform(rng, 0, k_len - 1);
      r = RowSpan::interval(std::min(a, b), std::max(a, b));
      break;
    }
    case 2: r = RowSpan::interval(0, uniform(rng, 0, k_len - 1)); break;
    case 3:  // any bits: the encoding is exact for every row
      r.first = static_cast<std::int64_t>(rng());
      r.last = static_cast<std::int64_t>(rng());
      r.count = static_cast<std::int64_t>(rng() % 4);
      r.reserved = static_cast<std::uint32_t>(rng() % 2);
      break;
    default: {
      const std::int64_t a = uniform(rng, 0, k_len - 1), b = uniform(rng, 0, k_len - 1);
      r = RowSpan::interval(std::min(a, b), std::max(a, b));
      if (r.count > 2) --r.count;
      break;
    }
  }
  if (coin(rng, 0.05)) r.flags |= kRowFiniteMasked;
  return r;
}

// A table of `slices` x q_len rows: structured slices with stretches of random rows.
SpanTable mixed_table(Rng& rng, std::int64_t slices, std::int64_t q_len, std::int64_t k_len, double noise) {
  SpanTable t;
  t.batch = t.distinct_batch = slices;
  t.heads = t.distinct_heads = 1;
  t.q_len = q_len;
  t.k_len = k_len;
  t.rows.reserve(static_cast<std::size_t>(slices * q_len));
  for (std::int64_t s = 0; s < slices; ++s) {
    const MaskStructure spec = random_structure(rng, 1, q_len, k_len);
    for (std::int64_t q = 0; q < q_len; ++q) t.rows.push_back(coin(rng, noise) ? random_row(rng, k_len) : spec.row(0, q));
  }
  return t;
}

}  // namespace

TEST_SUITE("cuda") {

TEST_CASE("device runs equal the host encoding on random tables, across tile and prefix-pass edges") {
  Rng rng(test_seed(1301));
  // Rows around the tile (kRunsTileRows) and the prefix kernel's pass (kRunsThreads tiles).
  constexpr std::int64_t tile = masklens::gpu::detail::kRunsTileRows;
  constexpr std::int64_t pass = tile * masklens::gpu::detail::kRunsThreads;
  const std::int64_t row_counts[] = {1,        2,        3,        7,        tile - 1,  tile,    tile + 1,
                                     2 * tile - 1, 2 * tile, 2 * tile + 1, 65536 + 5, pass - 1, pass,
                                     pass + 1, 2 * pass + 3, 1100003};
  int compared = 0;
  for (const std::int64_t rows : row_counts)
    for (int rep = 0; rep < 3; ++rep) {
      // Slices of q_len rows: 1, one slice, or a divisor.
      std::int64_t q_len = rep == 0 ? rows : rep == 1 ? 1 : 1;
      if (rep == 2)
        for (std::int64_t d : {std::int64_t{1000}, std::int64_t{97}, std::int64_t{7}, std::int64_t{3}})
          if (rows % d == 0 && rows > d) {
            q_len = d;
            break;
          }
      const std::int64_t k_len = uniform(rng, 1, 300);
      const double noise = rep == 0 ? 0.001 : 0.2;
      SpanTable t = mixed_table(rng, rows / q_len, q_len, k_len, noise);
      // Rows holding NaN / +inf in half the tables: the first is reported, wherever it lies.
      if (coin(rng, 0.5))
        for (int k = uniform(rng, 1, 3); k > 0; --k)
          t.rows[static_cast<std::size_t>(uniform(rng, 0, rows - 1))].flags |= kRowInvalid;
      INFO("rows " << rows << " q_len " << q_len);
      Result<SpanRuns> host = SpanRuns::encode(t);
      REQUIRE(host.ok());
      require_same_runs(*host, device_runs(t));
      // With room for fewer runs than there are: the count in full, the first runs stored.
      const auto n = static_cast<std::int64_t>(host->runs.size());
      if (n > 1) {
        std::int64_t count = 0;
        SpanRuns some = *host;
        some.runs.resize(static_cast<std::size_t>(n / 2));
        require_same_runs(some, device_runs(t, nullptr, n / 2, &count));
        CHECK(count == n);
      }
      ++compared;
    }
  // Every row its own run, and one run over every row.
  for (const std::int64_t rows : {std::int64_t{5000}, std::int64_t{600000}}) {
    SpanTable t;
    t.batch = t.heads = t.distinct_batch = t.distinct_heads = 1;
    t.q_len = rows;
    t.k_len = 3;
    for (std::int64_t q = 0; q < rows; ++q) t.rows.push_back(RowSpan::interval(0, (q * 7919) % 3));
    require_same_runs(*SpanRuns::encode(t), device_runs(t));
    for (std::int64_t q = 0; q < rows; ++q) t.rows[static_cast<std::size_t>(q)] = RowSpan{};
    require_same_runs(*SpanRuns::encode(t), device_runs(t));
    compared += 2;
  }
  MESSAGE("device runs == host runs on " << compared << " tables");
}

TEST_CASE("scan_runs and inspect_runs equal encode(scan) and inspect on generated and mutated masks") {
  Rng rng(test_seed(1302));
  const ElementType types[] = {ElementType::boolean, ElementType::uint8, ElementType::float16, ElementType::bfloat16,
                               ElementType::float32};
  const int cases = std::max(1, suite_cases(10000) / 4);
  int compared = 0;
  for (int i = 0; i < cases; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 300), k_len = coin(rng) ? q_len : uniform(rng, 1, 300);
    const ElementType dtype = types[uniform(rng, 0, 4)];
    const Layout layout = static_cast<Layout>(uniform(rng, 0, 3));
    const std::int64_t batch = uniform(rng, 1, 2), heads = uniform(rng, 1, 2);
    MaskStructure spec = layout == Layout::expand ? repeat_batches(random_structure(rng, 1, q_len, k_len), batch)
                                                  : random_structure(rng, batch, q_len, k_len);
    DenseMask dense = render(spec, heads, dtype, Polarity::true_attends, layout, rng, coin(rng, 0.2) ? 0.2 : 0.0);
    if (coin(rng, 0.3)) {  // one flipped element
      auto* raw = const_cast<std::uint8_t*>(dense.view.element_ptr(0, 0, 0, 0));
      const std::int64_t q = uniform(rng, 0, q_len - 1), k = uniform(rng, 0, k_len - 1);
      write_value(raw + dense.view.offset(0, 0, q, k) * element_size(dtype), dtype, dense.view.encoding().polarity,
                  attends(dense.view.at(0, 0, q, k)) ? Value::masked : Value::allowed, 0);
    }
    DeviceBuffer mask(static_cast<std::size_t>(dense.view.extent_bytes()));
    REQUIRE_CUDA(cudaMemcpy(mask.get(), dense.view.data(), static_cast<std::size_t>(dense.view.extent_bytes()),
                            cudaMemcpyHostToDevice));
    REQUIRE_CUDA(cudaDeviceSynchronize());
    auto view = MaskView::make(mask.get(), dense.view.dtype(), dense.view.shape(), dense.view.strides(),
                               dense.view.encoding());
    REQUIRE(view.ok());
    INFO(dense.describe);
    Result<SpanTable> table = gpu::scan(*view);
    Result<SpanRuns> runs = gpu::scan_runs(*view);
    REQUIRE_MESSAGE(table.ok(), table.status().to_string());
    REQUIRE_MESSAGE(runs.ok(), runs.status().to_string());
    require_same_runs(*SpanRuns::encode(*table), *runs);
    Result<MaskStructure> by_rows = gpu::inspect(*view), by_runs = gpu::inspect_runs(*view);
    REQUIRE(by_rows.ok());
    REQUIRE(by_runs.ok());
    CHECK(structure_fields(*by_runs) == structure_fields(*by_rows));
    ++compared;
  }
  MESSAGE("scan_runs == encode(scan) and inspect_runs == inspect on " << compared << " masks");
}

TEST_CASE("more runs than the first copy brings, and more than scan_runs makes room for: the rest follow") {
  // A different interval per row (runs of two rows): 1500 runs, past the 256 copied with
  // the count; then 10000 rows, 5000 runs, past the 4096 scan_runs has room for at first.
  for (const std::int64_t L : {std::int64_t{3000}, std::int64_t{10000}}) {
    std::vector<std::uint8_t> m(static_cast<std::size_t>(L * L), 0);
    for (std::int64_t q = 0; q < L; ++q) {
      const std::int64_t lo = (q * 7919) % L, hi = std::min(L - 1, lo + (q * 31) % 97);
      for (std::int64_t k = lo; k <= hi; ++k) m[static_cast<std::size_t>(q * L + k)] = 1;
    }
    DeviceBuffer mask(m.size());
    REQUIRE_CUDA(cudaMemcpy(mask.get(), m.data(), m.size(), cudaMemcpyHostToDevice));
    REQUIRE_CUDA(cudaDeviceSynchronize());
    const std::int64_t shape[] = {L, L};
    auto view = MaskView::contiguous(mask.get(), ElementType::boolean, shape);
    REQUIRE(view.ok());
    auto runs = gpu::scan_runs(*view);
    auto table = gpu::scan(*view);
    REQUIRE(runs.ok());
    REQUIRE(table.ok());
    INFO("L " << L);
    CHECK(static_cast<std::int64_t>(runs->runs.size()) > L / 3);
    require_same_runs(*SpanRuns::encode(*table), *runs);
    CHECK(structure_fields(*gpu::inspect_runs(*view)) == structure_fields(*classify(*table)));
  }
}

TEST_CASE("69632^2 bool causal and left-padded causal: one and two runs, the verdicts of inspect") {
  const std::int64_t L = suite_length(69632, 4096);  // whole chunks of 1024 rows
  for (const std::int64_t pad : {std::int64_t{0}, std::int64_t{1234}}) {
    std::vector<std::uint8_t> rows(static_cast<std::size_t>(1024 * L));
    DeviceBuffer mask(static_cast<std::size_t>(L * L));
    for (std::int64_t q0 = 0; q0 < L; q0 += 1024) {
      for (std::int64_t i = 0; i < 1024; ++i) {
        std::uint8_t* row = rows.data() + i * L;
        std::memset(row, 0, static_cast<std::size_t>(L));
        if (q0 + i >= pad) std::memset(row + pad, 1, static_cast<std::size_t>(q0 + i - pad + 1));
      }
      REQUIRE_CUDA(cudaMemcpy(mask.get() + q0 * L, rows.data(), rows.size(), cudaMemcpyHostToDevice));
    }
    REQUIRE_CUDA(cudaDeviceSynchronize());
    const std::int64_t shape[] = {L, L};
    auto view = MaskView::contiguous(mask.get(), ElementType::boolean, shape);
    REQUIRE(view.ok());
    auto runs = gpu::scan_runs(*view);
    REQUIRE(runs.ok());
    CHECK(runs->runs.size() == (pad == 0 ? 1u : 2u));
    RunsClassifyStats stats;
    auto verdict = classify(*runs, &stats);
    REQUIRE(verdict.ok());
    CHECK_FALSE(stats.expanded);
    CHECK(structure_fields(*verdict) == structure_fields(*gpu::inspect(*view)));
    CHECK(verdict->kind == StructureKind::causal);
    CHECK(verdict->has_kv_valid() == (pad != 0));
  }
}

TEST_CASE("NaN in a device mask: inspect_runs names the row as inspect does") {
  std::vector<std::uint16_t> m(40 * 50, 0xFF80);  // bf16 -inf
  for (std::int64_t q = 0; q < 40; ++q)
    for (std::int64_t k = 0; k <= std::min<std::int64_t>(q, 49); ++k) m[static_cast<std::size_t>(q * 50 + k)] = 0;
  m[17 * 50 + 33] = 0x7FC0;  // NaN
  DeviceBuffer mask(m.size() * 2);
  REQUIRE_CUDA(cudaMemcpy(mask.get(), m.data(), m.size() * 2, cudaMemcpyHostToDevice));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const std::int64_t shape[] = {40, 50};
  auto view = MaskView::contiguous(mask.get(), ElementType::bfloat16, shape);
  REQUIRE(view.ok());
  const auto by_rows = gpu::inspect(*view), by_runs = gpu::inspect_runs(*view);
  REQUIRE_FALSE(by_rows.ok());
  REQUIRE_FALSE(by_runs.ok());
  CHECK(by_runs.status().to_string() == by_rows.status().to_string());
  CHECK(by_runs.status().message().find("mask row [0, 0, 17]") != std::string::npos);
}

TEST_CASE("NaN in a device mask of several slices and past the first copy's runs: the first such row is named") {
  // [2, 3, 300, 64] bf16, a different interval per row (about 150 runs a slice, 900 in
  // all: past the 256 copied with the count), NaN / +inf placed in later slices, in rows
  // of runs the first copy does not bring, one slice with two. scan_runs names the first
  // such row as inspect() does, from the run reduction's first invalid row.
  const std::int64_t B = 2, H = 3, Q = 300, K = 64;
  struct Placed {
    std::int64_t b, h, q, k;
    std::uint16_t value;
  };
  const std::vector<std::vector<Placed>> cases = {
      {{1, 2, 299, 63, 0x7FC0}},                          // the last row, NaN
      {{0, 2, 250, 5, 0x7F80}, {1, 0, 3, 7, 0x7FC0}},     // +inf in slice 2 before NaN in slice 3
      {{1, 1, 0, 0, 0x7FC0}, {1, 1, 1, 0, 0x7FC0}},       // a slice's first two rows
      {{0, 1, 200, 40, 0xFFC1}},                          // a NaN with the sign bit
  };
  for (const auto& placed : cases) {
    std::vector<std::uint16_t> m(static_cast<std::size_t>(B * H * Q * K), 0xFF80);  // -inf
    for (std::int64_t s = 0; s < B * H; ++s)
      for (std::int64_t q = 0; q < Q; ++q) {
        const std::int64_t lo = (q * 37 + s * 11) % K, hi = std::min(K - 1, lo + q % 5);
        for (std::int64_t k = lo; k <= hi; ++k) m[static_cast<std::size_t>((s * Q + q) * K + k)] = 0;
      }
    for (const Placed& p : placed) m[static_cast<std::size_t>(((p.b * H + p.h) * Q + p.q) * K + p.k)] = p.value;
    DeviceBuffer mask(m.size() * 2);
    REQUIRE_CUDA(cudaMemcpy(mask.get(), m.data(), m.size() * 2, cudaMemcpyHostToDevice));
    REQUIRE_CUDA(cudaDeviceSynchronize());
    const std::int64_t shape[] = {B, H, Q, K};
    auto view = MaskView::contiguous(mask.get(), ElementType::bfloat16, shape);
    REQUIRE(view.ok());
    const Placed& first = placed.front();
    const std::string where = "mask row [" + std::to_string(first.b) + ", " + std::to_string(first.h) + ", " +
                              std::to_string(first.q) + "]";
    INFO(where);
    const auto by_rows = gpu::inspect(*view);
    const auto runs = gpu::scan_runs(*view);
    REQUIRE_FALSE(by_rows.ok());
    REQUIRE_FALSE(runs.ok());
    CHECK(runs.status().code() == ErrorCode::invalid_value);
    CHECK(runs.status().to_string() == by_rows.status().to_string());
    CHECK(runs.status().message().find(where) != std::string::npos);
    // Without the NaN / +inf the same mask's runs are past the first copy's 256.
    for (const Placed& p : placed) m[static_cast<std::size_t>(((p.b * H + p.h) * Q + p.q) * K + p.k)] = 0xFF80;
    REQUIRE_CUDA(cudaMemcpy(mask.get(), m.data(), m.size() * 2, cudaMemcpyHostToDevice));
    REQUIRE_CUDA(cudaDeviceSynchronize());
    const auto clean = gpu::scan_runs(*view);
    REQUIRE(clean.ok());
    CHECK(clean->runs.size() > 256u);
  }
}

TEST_CASE("reduce_runs: two-phase on the caller's stream, recorded into a CUDA graph, arguments named") {
  Rng rng(test_seed(1303));
  const SpanTable t = mixed_table(rng, 3, 5000, 200, 0.01);
  const auto rows = static_cast<std::int64_t>(t.rows.size());
  const SpanRuns host = *SpanRuns::encode(t);
  DeviceBuffer d_rows(t.rows.size() * sizeof(RowSpan)), d_runs(t.rows.size() * sizeof(SpanRun)), d_count(8);
  REQUIRE_CUDA(cudaMemcpy(d_rows.get(), t.rows.data(), t.rows.size() * sizeof(RowSpan), cudaMemcpyHostToDevice));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  cudaStream_t stream = nullptr;
  REQUIRE_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::size_t temp_bytes = 0;
  REQUIRE(gpu::reduce_runs(nullptr, temp_bytes, nullptr, rows, t.q_len, nullptr, 1, nullptr, nullptr, stream).ok());
  CHECK(temp_bytes > 0);
  DeviceBuffer temp(temp_bytes);

  SUBCASE("captured: a synchronisation inside would invalidate the capture") {
    REQUIRE_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status st = gpu::reduce_runs(temp.get(), temp_bytes, d_rows.get<RowSpan>(), rows, t.q_len,
                                       d_runs.get<SpanRun>(), rows, d_count.get<std::int64_t>(), nullptr, stream);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE_MESSAGE(ended == cudaSuccess, std::string(cudaGetErrorName(ended)));
    cudaGraphExec_t exec = nullptr;
    REQUIRE_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    REQUIRE_CUDA(cudaMemsetAsync(d_runs.get(), 0xff, t.rows.size() * sizeof(SpanRun), stream));
    REQUIRE_CUDA(cudaMemsetAsync(d_count.get(), 0xff, 8, stream));
    REQUIRE_CUDA(cudaGraphLaunch(exec, stream));
    std::int64_t count = 0;
    REQUIRE_CUDA(cudaMemcpyAsync(&count, d_count.get(), 8, cudaMemcpyDeviceToHost, stream));
    REQUIRE_CUDA(cudaStreamSynchronize(stream));
    REQUIRE(count == static_cast<std::int64_t>(host.runs.size()));
    SpanRuns device = SpanRuns::shape_of(t);
    device.runs.resize(static_cast<std::size_t>(count));
    REQUIRE_CUDA(cudaMemcpy(device.runs.data(), d_runs.get(), device.runs.size() * sizeof(SpanRun),
                            cudaMemcpyDeviceToHost));
    require_same_runs(host, device);
    REQUIRE_CUDA(cudaGraphExecDestroy(exec));
    REQUIRE_CUDA(cudaGraphDestroy(graph));
  }
  SUBCASE("arguments") {
    const auto call = [&](void* tmp, std::size_t bytes, const RowSpan* r, std::int64_t n, std::int64_t q, SpanRun* out,
                          std::int64_t* count) {
      std::size_t b = bytes;
      return gpu::reduce_runs(tmp, b, r, n, q, out, n, count, nullptr, stream).message();
    };
    RowSpan* r = d_rows.get<RowSpan>();
    SpanRun* out = d_runs.get<SpanRun>();
    std::int64_t* count = d_count.get<std::int64_t>();
    CHECK(call(temp.get(), temp_bytes, r, rows, 7, out, count) ==
          "rows (15000) must be a positive multiple of q_len (7)");
    CHECK(call(temp.get(), 0, r, rows, t.q_len, out, count).find("temp_storage_bytes is 0") == 0);
    CHECK(call(temp.get(), temp_bytes, nullptr, rows, t.q_len, out, count) == "d_rows is null");
    CHECK(call(temp.get(), temp_bytes, r, rows, t.q_len, nullptr, count) == "d_runs is null");
    CHECK(call(temp.get(), temp_bytes, r, rows, t.q_len, out, nullptr) == "d_run_count is null");
    CHECK(call(temp.get(), temp_bytes, reinterpret_cast<RowSpan*>(d_rows.get() + 4), rows - 1, rows - 1, out, count) ==
          "d_rows is not aligned to RowSpan");
  }
  REQUIRE_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE("a CUDA error pending from the caller is neither cleared nor taken for the run reduction's" *
          kApiErrorOnPurpose) {
  std::vector<std::uint8_t> m(64 * 64);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = i % 64 <= i / 64;
  DeviceBuffer buffer(m.size());
  REQUIRE_CUDA(cudaMemcpy(buffer.get(), m.data(), m.size(), cudaMemcpyHostToDevice));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const std::int64_t shape[] = {64, 64};
  auto view = MaskView::contiguous(buffer.get(), ElementType::boolean, shape);
  REQUIRE(view.ok());
  leave_allocation_error_pending();
  auto verdict = gpu::inspect_runs(*view);
  REQUIRE_MESSAGE(verdict.ok(), verdict.status().to_string());
  CHECK(verdict->kind == StructureKind::causal);
  const cudaError_t still = cudaGetLastError();  // the test is the caller: it clears its own error
  CHECK(still == cudaErrorMemoryAllocation);
}

}  // TEST_SUITE
