// The device scanner against the host scanner (the oracle) on generated and mutated
// masks of every kind, type, layout and alignment, and on masks past 2^32 elements;
// and its contract: two-phase on the caller's stream with no synchronisation inside
// (it records into a CUDA graph), the caller's pending CUDA error neither cleared nor
// taken for its own. Plain C++: the CUDA runtime API and masklens/cuda/scan.hpp.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>
#include <masklens/cuda/scan.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../support/additive_encodings.hpp"
#include "../support/device_buffer.hpp"
#include "../support/mask_gen.hpp"
#include "suite_size.hpp"
#include "../support/mutated_masks.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

// A bool [L, L] causal mask on the device (L*L may exceed 2^32), built in host chunks
// of rows so that no L*L host buffer is needed.
void fill_causal(std::uint8_t* d_mask, std::int64_t L) {
  const std::int64_t chunk = 1024;
  std::vector<std::uint8_t> rows(static_cast<std::size_t>(chunk * L));
  for (std::int64_t q0 = 0; q0 < L; q0 += chunk) {
    const std::int64_t n = std::min(chunk, L - q0);
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint8_t* row = rows.data() + i * L;
      std::memset(row, 1, static_cast<std::size_t>(q0 + i + 1));
      std::memset(row + q0 + i + 1, 0, static_cast<std::size_t>(L - (q0 + i + 1)));
    }
    REQUIRE_CUDA(cudaMemcpy(d_mask + q0 * L, rows.data(), static_cast<std::size_t>(n * L), cudaMemcpyHostToDevice));
  }
}

void set_element(std::uint8_t* d_mask, std::int64_t L, std::int64_t q, std::int64_t k, std::uint8_t v) {
  REQUIRE_CUDA(cudaMemcpy(d_mask + q * L + k, &v, 1, cudaMemcpyHostToDevice));
}

void require_same_spans(const SpanTable& host, const SpanTable& device) {
  REQUIRE(host.rows.size() == device.rows.size());
  for (std::size_t r = 0; r < host.rows.size(); ++r) {
    INFO("row " << r);
    REQUIRE(host.rows[r].count == device.rows[r].count);
    REQUIRE(host.rows[r].same_keys(device.rows[r]));
    REQUIRE(host.rows[r].flags == device.rows[r].flags);
  }
}

}  // namespace

TEST_SUITE("cuda") {

TEST_CASE("device spans equal host spans on generated and mutated masks") {
  Rng rng(test_seed(404));
  int compared = 0;
  const int cases = suite_cases(10000);
  for (int i = 0; i < cases; ++i) {
    MutatedMask mutated = mutated_mask(rng, 64);
    const DenseMask& dense = mutated.dense;
    const std::string& encoding = mutated.encoding;
    const int esize = element_size(dense.view.dtype());
    const std::int64_t offset = esize * uniform(rng, 0, 16 / esize);
    auto host = scan(dense.view);
    auto device = gpu::scan_host_mask(dense.view, offset);
    INFO(dense.describe << " encoding " << encoding << " offset " << offset);
    REQUIRE(host.ok());
    REQUIRE_MESSAGE(device.ok(), device.status().to_string());
    REQUIRE(host->rows.size() == device->rows.size());
    for (std::size_t r = 0; r < host->rows.size(); ++r) {
      const RowSpan& a = host->rows[r];
      const RowSpan& b = device->rows[r];
      REQUIRE(a.count == b.count);
      REQUIRE(a.same_keys(b));
      REQUIRE(a.flags == b.flags);
    }
    ++compared;
  }
  MESSAGE("device == host on " << compared << " masks");
}

TEST_CASE("vector path boundaries: one changed element anywhere, any row length, any start alignment") {
  // Rows around every edge of the 16-byte vector path (head, vectors, tail, both kernels:
  // a warp per row below 2 KiB, a block per row from there), each with one element unlike
  // the rest, checked against the span it must give (not only against the host).
  struct Kind {
    ElementType dtype;
    Polarity polarity;
    Encoding encoding;  // additive types
  };
  const Kind kinds[] = {
      {ElementType::boolean, Polarity::true_attends, Encoding::neg_inf},
      {ElementType::boolean, Polarity::true_masks, Encoding::neg_inf},
      {ElementType::uint8, Polarity::true_attends, Encoding::neg_inf},
      {ElementType::int8, Polarity::true_masks, Encoding::neg_inf},
      {ElementType::float16, Polarity::true_attends, Encoding::neg_inf},
      {ElementType::float16, Polarity::true_attends, Encoding::lowest},
      {ElementType::float16, Polarity::true_attends, Encoding::minus_1e4},
      {ElementType::bfloat16, Polarity::true_attends, Encoding::neg_inf},
      {ElementType::bfloat16, Polarity::true_attends, Encoding::lowest},
      {ElementType::bfloat16, Polarity::true_attends, Encoding::minus_1e4},
      {ElementType::float32, Polarity::true_attends, Encoding::neg_inf},
      {ElementType::float32, Polarity::true_attends, Encoding::lowest},
      {ElementType::float32, Polarity::true_attends, Encoding::minus_1e4},
  };
  // The shortened run (compute-sanitizer) keeps a few lengths on each side of the edges.
  const bool quick = sanitizer_sized() || std::getenv("MASKLENS_CUDA_CASES") != nullptr;
  const std::vector<std::int64_t> lengths =
      quick ? std::vector<std::int64_t>{1, 7, 9, 17, 33, 129, 513, 1025, 2049}
            : std::vector<std::int64_t>{1,   2,   3,   4,   5,   7,   8,   9,    15,   16,   17,   31,   32,   33,   63,
                                        64,  65,  127, 128, 129, 511, 512, 513, 1023, 1024, 1025, 2047, 2048, 2049, 4099};
  Rng rng(test_seed(409));
  int scans = 0;
  for (const Kind& kind : kinds) {
    const ElementType dtype = kind.dtype;
    const int esize = element_size(dtype);
    const bool additive = is_additive(dtype);
    // Element values: attending and masked; additive rows also take the other kind of
    // masked value (finite among -inf, -inf among finite), a bias, and -0.
    const std::uint32_t attend = additive ? 0u : kind.polarity == Polarity::true_attends ? 0x80u : 0u;
    const std::uint32_t masked = additive ? masked_bits(dtype, kind.encoding, rng)
                                          : kind.polarity == Polarity::true_attends ? 0u : 0xffu;
    const std::uint32_t neg_inf = encode(dtype, -std::numeric_limits<float>::infinity());
    const std::uint32_t other_masked = kind.encoding == Encoding::neg_inf ? encode(dtype, -1e4f) : neg_inf;
    const std::uint32_t bias = encode(dtype, -1.5f), neg_zero = esize == 4 ? 0x80000000u : 0x8000u;
    // Which values attend (bias and -0 only in additive rows).
    const auto attends_value = [&](std::uint32_t v) {
      return v == attend || (additive && (v == bias || v == neg_zero));
    };
    for (const std::int64_t k_len : lengths) {
      std::vector<std::int64_t> positions;
      for (std::int64_t k = 0; k < k_len; ++k)
        if (k_len <= 160 || k < 64 || k >= k_len - 64) positions.push_back(k);
      if (k_len > 160)
        for (int i = 0; i < 32; ++i) positions.push_back(uniform(rng, 64, k_len - 65));
      // Per position: one attending key among masked ones, one masked key among
      // attending ones and, additive, the other masked value among masked ones and a
      // bias among them; then a row of each value alone.
      struct Row {
        std::uint32_t background, changed;
        std::int64_t at;
      };
      std::vector<Row> rows;
      for (const std::int64_t k : positions) {
        rows.push_back({masked, attend, k});
        rows.push_back({attend, masked, k});
        if (additive) {
          rows.push_back({masked, other_masked, k});
          rows.push_back({masked, bias, k});
          rows.push_back({neg_zero, masked, k});
        }
      }
      rows.push_back({masked, masked, 0});
      rows.push_back({attend, attend, 0});
      const auto q_len = static_cast<std::int64_t>(rows.size());
      std::vector<std::uint64_t> storage(static_cast<std::size_t>((q_len * k_len * esize + 7) / 8));
      auto* bytes = reinterpret_cast<std::uint8_t*>(storage.data());
      for (std::int64_t q = 0; q < q_len; ++q)
        for (std::int64_t k = 0; k < k_len; ++k) {
          const Row& row = rows[static_cast<std::size_t>(q)];
          const std::uint32_t v = k == row.at ? row.changed : row.background;
          std::uint8_t* p = bytes + (q * k_len + k) * esize;
          if (esize == 1) *p = static_cast<std::uint8_t>(v);
          else store_bits(p, dtype, v);
        }
      MaskEncoding enc;
      enc.polarity = kind.polarity;
      const std::int64_t shape[] = {q_len, k_len};
      auto view = MaskView::contiguous(bytes, dtype, shape, enc);
      REQUIRE(view.ok());
      auto host = scan(*view);
      REQUIRE(host.ok());
      // The span each row must have, from its construction.
      std::vector<RowSpan> want(rows.size());
      for (std::size_t q = 0; q < rows.size(); ++q) {
        const Row& row = rows[q];
        RowSpan& w = want[q];
        for (std::int64_t k = 0; k < k_len; ++k) {
          const std::uint32_t v = k == row.at ? row.changed : row.background;
          if (attends_value(v)) w = merge(w, RowSpan::interval(k, k));
          if (additive && v == bias) w.flags |= kRowBias;
          if (additive && !attends_value(v) && v != neg_inf) w.flags |= kRowFiniteMasked;
        }
      }
      const int per_vector = 16 / esize;
      std::vector<int> offsets;
      for (int o = 0; o < per_vector; ++o)
        if (!quick || o == 0 || o == 1 || o == per_vector - 1) offsets.push_back(o);
      for (const int o : offsets) {
        auto device = gpu::scan_host_mask(*view, o * esize);
        ++scans;
        INFO(to_string(dtype) << (additive ? std::string(" ") + to_string(kind.encoding)
                                           : kind.polarity == Polarity::true_attends ? " true attends" : " true masks")
                              << " K=" << k_len << " start " << o << " elements past 16 bytes");
        REQUIRE_MESSAGE(device.ok(), device.status().to_string());
        for (std::size_t q = 0; q < rows.size(); ++q) {
          INFO("row " << q << " changed element at " << rows[q].at);
          const RowSpan& got = device->rows[q];
          REQUIRE(got.count == want[q].count);
          REQUIRE(got.same_keys(want[q]));
          REQUIRE(got.flags == want[q].flags);
          REQUIRE(host->rows[q].same_keys(got));
          REQUIRE(host->rows[q].flags == got.flags);
        }
      }
    }
  }
  MESSAGE(scans << " boundary scans, every row exact");
}

TEST_CASE("every 16-bit pattern and sampled fp32 patterns classify alike on host and device, at any threshold") {
  Rng rng(test_seed(405));
  for (const ElementType dtype : {ElementType::float16, ElementType::bfloat16, ElementType::float32}) {
    for (const float threshold : {-1000.0f, -1.0f, -65504.0f, -3.0e38f, -1e-3f, -9984.0f}) {
      const std::int64_t q_len = 256, k_len = 256;
      std::vector<std::uint32_t> store(static_cast<std::size_t>(q_len * k_len), 0);
      for (std::int64_t i = 0; i < q_len * k_len; ++i) {
        std::uint32_t bits = dtype == ElementType::float32 ? static_cast<std::uint32_t>(rng()) : static_cast<std::uint32_t>(i);
        if (dtype == ElementType::float32 && i % 7 == 0)  // near the threshold and the special values
          bits = std::bit_cast<std::uint32_t>(threshold) + static_cast<std::uint32_t>(uniform(rng, -3, 3));
        const float f = dtype == ElementType::float32 ? std::bit_cast<float>(bits)
                        : dtype == ElementType::bfloat16 ? bfloat16_to_float(static_cast<std::uint16_t>(bits))
                                                         : float16_to_float(static_cast<std::uint16_t>(bits));
        if (std::isnan(f) || f == std::numeric_limits<float>::infinity()) bits = 0;  // those are errors
        store[static_cast<std::size_t>(i)] = bits;
      }
      std::vector<std::uint16_t> narrow(store.begin(), store.end());
      const void* data = dtype == ElementType::float32 ? static_cast<const void*>(store.data()) : narrow.data();
      MaskEncoding enc;
      enc.masked_threshold = threshold;
      const std::int64_t shape[] = {q_len, k_len};
      auto view = MaskView::contiguous(data, dtype, shape, enc);
      REQUIRE(view.ok());
      auto host = scan(*view);
      auto device = gpu::scan_host_mask(*view);
      INFO(to_string(dtype) << " threshold " << threshold);
      REQUIRE(host.ok());
      REQUIRE(device.ok());
      for (std::size_t r = 0; r < host->rows.size(); ++r) {
        REQUIRE(host->rows[r].count == device->rows[r].count);
        REQUIRE(host->rows[r].same_keys(device->rows[r]));
        REQUIRE(host->rows[r].flags == device->rows[r].flags);
      }
    }
  }
}

TEST_CASE("0 / -inf vectors: any other value among them is seen, in every lane") {
  // The device classifies whole 16-byte vectors of 0, -0 and -inf at once; every other
  // value (bias, finite masked, extreme finite, denormals, NaN, +inf) must still count.
  struct Codes {
    ElementType dtype;
    std::uint32_t zero, neg_zero, neg_inf;
    std::vector<std::uint32_t> others;  // -1, 0.5, -10000, lowest finite, +-denormal
    std::uint32_t nan, pos_inf;
  };
  const Codes codes[] = {
      {ElementType::float16, 0, 0x8000, 0xfc00, {0xbc00, 0x3800, 0xf0e2, 0xfbff, 0x0001, 0x8001}, 0xfe00, 0x7c00},
      {ElementType::bfloat16, 0, 0x8000, 0xff80, {0xbf80, 0x3f00, 0xc61c, 0xff7f, 0x0001, 0x8001}, 0xffc0, 0x7f80},
      {ElementType::float32, 0, 0x80000000u, 0xff800000u,
       {0xbf800000u, 0x3f000000u, 0xc61c4000u, 0xff7fffffu, 0x00000001u, 0x80000001u}, 0xffc00000u, 0x7f800000u},
  };
  Rng rng(test_seed(406));
  for (const Codes& c : codes) {
    const std::int64_t q_len = 96, k_len = 203;  // not a multiple of any vector width
    auto fill = [&](std::uint32_t special, std::int64_t special_row) {
      std::vector<std::uint32_t> bits(static_cast<std::size_t>(q_len * k_len));
      for (std::int64_t i = 0; i < q_len * k_len; ++i) {
        const auto pick = uniform(rng, 0, 3);
        bits[static_cast<std::size_t>(i)] = pick == 0 ? c.zero : pick == 1 ? c.neg_zero : c.neg_inf;
      }
      for (std::int64_t r = 0; r < q_len; ++r) {
        if (special_row >= 0 && r != special_row) continue;
        if (special_row < 0 && r % 4 == 3) continue;  // some rows stay plain
        const std::uint32_t v = special_row >= 0 ? special : c.others[static_cast<std::size_t>(r) % c.others.size()];
        bits[static_cast<std::size_t>(r * k_len + uniform(rng, 0, k_len - 1))] = v;
      }
      return bits;
    };
    auto scan_both = [&](const std::vector<std::uint32_t>& bits) {
      std::vector<std::uint16_t> narrow(bits.begin(), bits.end());
      const void* data = c.dtype == ElementType::float32 ? static_cast<const void*>(bits.data()) : narrow.data();
      const std::int64_t shape[] = {q_len, k_len};
      auto view = MaskView::contiguous(data, c.dtype, shape);
      REQUIRE(view.ok());
      return std::pair{scan(*view), gpu::scan_host_mask(*view)};
    };
    INFO(to_string(c.dtype));
    for (int trial = 0; trial < 20; ++trial) {
      auto [host, device] = scan_both(fill(0, -1));
      REQUIRE(host.ok());
      REQUIRE(device.ok());
      for (std::size_t r = 0; r < host->rows.size(); ++r) {
        INFO("row " << r);
        REQUIRE(host->rows[r].same_keys(device->rows[r]));
        REQUIRE(host->rows[r].flags == device->rows[r].flags);
        if (r % 4 != 3) CHECK(device->rows[r].flags != 0);  // the special value was seen
      }
    }
    for (const std::uint32_t bad : {c.nan, c.pos_inf}) {
      const std::int64_t row = uniform(rng, 0, q_len - 1);
      auto [host, device] = scan_both(fill(bad, row));
      CHECK_FALSE(host.ok());
      REQUIRE_FALSE(device.ok());
      CHECK(device.status().code() == ErrorCode::invalid_value);
      // The mask is on the host: the element is named, as the host scanner names it.
      CHECK(device.status().message() == host.status().message());
      CHECK(device.status().message().find("element [0, 0, " + std::to_string(row) + ", ") != std::string::npos);
    }
  }
}

TEST_CASE("NaN in a mask: a host mask names the element, a device mask the row, the two-phase spans flag it") {
  std::vector<float> m(4 * 300, 0.0f);
  m[2 * 300 + 7] = std::numeric_limits<float>::quiet_NaN();
  const std::int64_t shape[] = {4, 300};
  auto v = MaskView::contiguous(m.data(), ElementType::float32, shape);
  REQUIRE(v.ok());
  auto from_host = gpu::scan_host_mask(*v);
  REQUIRE_FALSE(from_host.ok());
  CHECK(from_host.status().code() == ErrorCode::invalid_value);
  CHECK(from_host.status().message().find("mask element [0, 0, 2, 7]") != std::string::npos);

  DeviceBuffer buffer(m.size() * sizeof(float));
  const MaskView on_device = to_device(*v, buffer);
  auto from_device = gpu::scan(on_device);
  REQUIRE_FALSE(from_device.ok());
  CHECK(from_device.status().code() == ErrorCode::invalid_value);
  CHECK(from_device.status().message().find("mask row [0, 0, 2]") != std::string::npos);
  auto structure = gpu::inspect(on_device);
  REQUIRE_FALSE(structure.ok());
  CHECK(structure.status().code() == ErrorCode::invalid_value);

  std::size_t temp_bytes = 0;
  REQUIRE(gpu::scan_spans(nullptr, temp_bytes, on_device, nullptr).ok());
  DeviceBuffer temp(temp_bytes), rows(4 * sizeof(RowSpan));
  REQUIRE(gpu::scan_spans(temp.get(), temp_bytes, on_device, rows.get<RowSpan>()).ok());
  std::vector<RowSpan> spans(4);
  REQUIRE_CUDA(cudaMemcpy(spans.data(), rows.get(), 4 * sizeof(RowSpan), cudaMemcpyDeviceToHost));
  for (int r = 0; r < 4; ++r) CHECK(static_cast<bool>(spans[static_cast<std::size_t>(r)].flags & kRowInvalid) == (r == 2));
}

TEST_CASE("two-phase on the caller's stream equals the host scanner, and records into a CUDA graph") {
  Rng rng(test_seed(407));
  MaskStructure spec = random_structure(rng, 2, 300, 2500);
  DenseMask dense = render(spec, 3, ElementType::bfloat16, Polarity::true_attends, Layout::contiguous, rng);
  auto host = scan(dense.view);
  REQUIRE(host.ok());
  DeviceBuffer mask(static_cast<std::size_t>(dense.view.extent_bytes()));
  const MaskView view = to_device(dense.view, mask);
  auto table = SpanTable::for_view(view);
  REQUIRE(table.ok());
  const std::size_t row_bytes = table->rows.size() * sizeof(RowSpan);
  REQUIRE(static_cast<std::int64_t>(table->rows.size()) == gpu::span_rows(view));

  cudaStream_t stream = nullptr;
  REQUIRE_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::size_t temp_bytes = 0;
  REQUIRE(gpu::scan_spans(nullptr, temp_bytes, view, nullptr, stream).ok());
  DeviceBuffer temp(temp_bytes), rows(row_bytes);

  SUBCASE("enqueued, then the caller synchronises once") {
    REQUIRE(gpu::scan_spans(temp.get(), temp_bytes, view, rows.get<RowSpan>(), stream).ok());
    REQUIRE_CUDA(cudaMemcpyAsync(table->rows.data(), rows.get(), row_bytes, cudaMemcpyDeviceToHost, stream));
    REQUIRE_CUDA(cudaStreamSynchronize(stream));
    require_same_spans(*host, *table);
  }
  SUBCASE("captured: a synchronisation inside would invalidate the capture") {
    REQUIRE_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status st = gpu::scan_spans(temp.get(), temp_bytes, view, rows.get<RowSpan>(), stream);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE_MESSAGE(ended == cudaSuccess, std::string(cudaGetErrorName(ended)));
    cudaGraphExec_t exec = nullptr;
    REQUIRE_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    REQUIRE_CUDA(cudaMemsetAsync(rows.get(), 0xff, row_bytes, stream));  // the graph, not a leftover, writes them
    REQUIRE_CUDA(cudaGraphLaunch(exec, stream));
    REQUIRE_CUDA(cudaMemcpyAsync(table->rows.data(), rows.get(), row_bytes, cudaMemcpyDeviceToHost, stream));
    REQUIRE_CUDA(cudaStreamSynchronize(stream));
    require_same_spans(*host, *table);
    REQUIRE_CUDA(cudaGraphExecDestroy(exec));
    REQUIRE_CUDA(cudaGraphDestroy(graph));
  }
  SUBCASE("scan_to_host: the spans in the caller's storage, copied to pinned host rows, plain and captured") {
    std::size_t step_bytes = 0;
    REQUIRE(gpu::scan_to_host(nullptr, step_bytes, view, nullptr, stream).ok());
    CHECK(step_bytes >= row_bytes);
    DeviceBuffer step(step_bytes);
    void* pinned_bytes = nullptr;
    REQUIRE_CUDA(cudaMallocHost(&pinned_bytes, row_bytes));
    auto* pinned = static_cast<RowSpan*>(pinned_bytes);
    const auto read_back = [&] {
      REQUIRE_CUDA(cudaStreamSynchronize(stream));
      std::copy(pinned, pinned + table->rows.size(), table->rows.begin());
      require_same_spans(*host, *table);
    };
    REQUIRE(gpu::scan_to_host(step.get(), step_bytes, view, pinned, stream).ok());
    read_back();
    // Every byte it touches is the caller's and nothing synchronises: it records into a graph.
    std::memset(static_cast<void*>(pinned), 0xff, row_bytes);
    REQUIRE_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status st = gpu::scan_to_host(step.get(), step_bytes, view, pinned, stream);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE_MESSAGE(ended == cudaSuccess, std::string(cudaGetErrorName(ended)));
    cudaGraphExec_t exec = nullptr;
    REQUIRE_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    REQUIRE_CUDA(cudaGraphLaunch(exec, stream));
    read_back();
    REQUIRE_CUDA(cudaGraphExecDestroy(exec));
    REQUIRE_CUDA(cudaGraphDestroy(graph));
    REQUIRE_CUDA(cudaFreeHost(pinned_bytes));
  }
  SUBCASE("the convenience scan on the same stream") {
    auto device = gpu::scan(view, stream);
    REQUIRE_MESSAGE(device.ok(), device.status().to_string());
    require_same_spans(*host, *device);
    auto structure = gpu::inspect(view, stream);
    REQUIRE(structure.ok());
    auto expected = classify(*host);
    REQUIRE(expected.ok());
    CHECK(describe(*structure) == describe(*expected));
  }
  REQUIRE_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE("a CUDA error pending from the caller's own work is neither cleared nor taken for the scan's" *
          kApiErrorOnPurpose) {
  std::vector<std::uint8_t> m(64 * 64);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = i % 64 <= i / 64;
  const std::int64_t shape[] = {64, 64};
  auto v = MaskView::contiguous(m.data(), ElementType::boolean, shape);
  REQUIRE(v.ok());
  DeviceBuffer buffer(m.size());
  const MaskView on_device = to_device(*v, buffer);
  leave_allocation_error_pending();
  auto device = gpu::scan(on_device);
  auto from_host = gpu::scan_host_mask(*v);
  const cudaError_t still = cudaGetLastError();  // the test is the caller: it clears its own error
  CHECK_MESSAGE(device.ok(), device.status().to_string());
  CHECK_MESSAGE(from_host.ok(), from_host.status().to_string());
  CHECK(still == cudaErrorMemoryAllocation);
  if (device.ok()) {
    auto s = classify(*device);
    REQUIRE(s.ok());
    CHECK(s->kind == StructureKind::causal);
  }
}

TEST_CASE("69632^2 bool causal on the device (Q*K > 2^32): causal; one flipped element is not") {
  const std::int64_t L = suite_length(69632, 4160);  // sanitizer-sized: the same block-per-row kernel
  DeviceBuffer mask(static_cast<std::size_t>(L * L));
  auto* d = mask.get();
  fill_causal(d, L);
  const std::int64_t shape[] = {L, L};
  auto view = MaskView::contiguous(d, ElementType::boolean, shape);
  REQUIRE(view.ok());
  auto t = gpu::scan(*view);
  REQUIRE_MESSAGE(t.ok(), t.status().to_string());
  auto s = classify(*t);
  REQUIRE(s.ok());
  CHECK(s->kind == StructureKind::causal);
  CHECK_FALSE(s->has_kv_valid());
  // Far past 2^32: the last row, a key in the middle.
  set_element(d, L, L - 1, L / 2, 0);
  auto flipped = gpu::scan(*view);
  REQUIRE(flipped.ok());
  auto f = classify(*flipped);
  REQUIRE(f.ok());
  CHECK(f->kind == StructureKind::arbitrary);
  CHECK(flipped->rows[static_cast<std::size_t>(L - 1)].count == L - 1);
  set_element(d, L, L - 1, L / 2, 1);
  // A future key in the first row.
  set_element(d, L, 0, L - 1, 1);
  auto g = gpu::inspect(*view);
  REQUIRE(g.ok());
  CHECK(g->kind != StructureKind::causal);
}

}  // TEST_SUITE
