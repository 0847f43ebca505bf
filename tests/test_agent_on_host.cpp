// The device scanner's agent (masklens/cuda/agent_scan.cuh: one thread's share of a row,
// the element readers, the lane classifier on 32-bit words, the span accumulator) run on
// the CPU through a stand-in for the CUDA builtins it uses (support/cuda_host_shim), each
// "thread" of a row in turn, the threads' accumulators merged as the kernels' reductions
// merge them. Held to the host scanner on generated masks of every type, layout,
// additive encoding and start alignment, at both thread counts the kernels use (a warp
// per row, a block of the sm_90 policy per row). The CUDA suite checks the kernels
// themselves on a GPU; this checks the logic in every build, without one.
#include <cuda_runtime.h>  // the stand-in: this program's include path has no CUDA

#include <doctest/doctest.h>

#include <masklens/cuda/agent_scan.cuh>
#include <masklens/cuda/tuning.cuh>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "support/additive_encodings.hpp"
#include "support/mask_gen.hpp"

using namespace masklens;
using namespace masklens::testing;
using namespace masklens::gpu::detail;

namespace {

// Every row as a kernel computes it: `Threads` agents, their accumulators merged in an
// order unlike the threads' (merge must not depend on it).
template <int Esize, int Threads>
std::vector<RowSpan> agent_rows(const ScanParams& s) {
  using Policy = typename ScanTuning<Esize, 900>::Policy;
  const AgentScanRow<Policy, Esize, SpanAccumulator, Threads> agent(s);
  std::vector<RowSpan> out(static_cast<std::size_t>(s.rows));
  for (std::int64_t r = 0; r < s.rows; ++r) {
    SpanAccumulator row{};
    for (int t = Threads - 1; t >= 0; t -= 2) row = SpanAccumulator::merge(agent.scan(r, t), row);
    for (int t = 0; t < Threads; t += 2) row = SpanAccumulator::merge(row, agent.scan(r, t));
    row.store(out.data(), r);
  }
  return out;
}

std::vector<RowSpan> agent_rows(const MaskView& view, int threads) {
  const ScanParams s = scan_params(view);
  switch (element_size(view.dtype())) {
    case 1: return threads == 32 ? agent_rows<1, 32>(s) : agent_rows<1, 256>(s);
    case 2: return threads == 32 ? agent_rows<2, 32>(s) : agent_rows<2, 256>(s);
    default: return threads == 32 ? agent_rows<4, 32>(s) : agent_rows<4, 256>(s);
  }
}

// `view` copied `offset` bytes past an 8-byte boundary (strides unchanged), as the CUDA
// suite's scan_host_mask places it past a 256-byte one.
struct Shifted {
  std::vector<std::uint64_t> storage;
  MaskView view;
  Shifted(const MaskView& from, std::int64_t offset)
      : storage(static_cast<std::size_t>(from.extent_bytes() / 8 + 4)) {
    auto* base = reinterpret_cast<std::uint8_t*>(storage.data()) + offset;
    std::memcpy(base, from.data(), static_cast<std::size_t>(from.extent_bytes()));
    view = *MaskView::make(base, from.dtype(), from.shape(), from.strides(), from.encoding());
  }
};

}  // namespace

TEST_SUITE("host") {

TEST_CASE("device agent on the CPU equals the host scanner: every type, layout, encoding, alignment") {
  Rng rng(test_seed(505));
  const ElementType types[] = {ElementType::boolean, ElementType::uint8,    ElementType::int8,
                               ElementType::float16, ElementType::bfloat16, ElementType::float32};
  std::int64_t rows = 0;
  for (int i = 0; i < 1500; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 12);
    const std::int64_t k_len = coin(rng) ? uniform(rng, 1, 160) : uniform(rng, 1, 3000);
    const ElementType dtype = types[uniform(rng, 0, 5)];
    const Layout layout = static_cast<Layout>(uniform(rng, 0, 3));
    const MaskStructure spec = random_structure(rng, 1, q_len, k_len);
    DenseMask dense = render(spec, uniform(rng, 1, 2), dtype,
                             coin(rng, 0.3) ? Polarity::true_masks : Polarity::true_attends, layout, rng,
                             coin(rng, 0.3) ? 0.2 : 0.0);
    std::string encoding = "rendered";
    if (is_additive(dtype) && coin(rng, 0.7)) {
      const Encoding e = kEncodings[uniform(rng, 0, std::ssize(kEncodings) - 1)];
      reencode(dense.view, e, rng);
      encoding = to_string(e);
    }
    // A few single changes: holes, extra keys, biases.
    auto* raw = const_cast<std::uint8_t*>(dense.view.element_ptr(0, 0, 0, 0));
    const int esize = element_size(dtype);
    for (int f = static_cast<int>(uniform(rng, 0, 3)); f > 0; --f) {
      const std::int64_t q = uniform(rng, 0, q_len - 1), k = uniform(rng, 0, k_len - 1);
      const bool was = attends(dense.view.at(0, 0, q, k));
      write_value(raw + dense.view.offset(0, 0, q, k) * esize, dtype, dense.view.encoding().polarity,
                  coin(rng, 0.2) ? Value::bias : was ? Value::masked : Value::allowed, f);
    }
    const Shifted shifted(dense.view, esize * uniform(rng, 0, 16 / esize - 1));
    auto host = scan(shifted.view);
    REQUIRE(host.ok());
    for (const int threads : {32, 256}) {
      const std::vector<RowSpan> agent = agent_rows(shifted.view, threads);
      INFO(dense.describe << " encoding " << encoding << " threads " << threads << " base +"
                          << (reinterpret_cast<std::uintptr_t>(shifted.view.data()) & 15));
      REQUIRE(agent.size() == host->rows.size());
      for (std::size_t r = 0; r < agent.size(); ++r) {
        INFO("row " << r);
        REQUIRE(agent[r].count == host->rows[r].count);
        REQUIRE(agent[r].same_keys(host->rows[r]));
        REQUIRE(agent[r].flags == host->rows[r].flags);
        ++rows;
      }
    }
  }
  MESSAGE(rows << " rows: the device agent on the CPU == the host scanner");
}

TEST_CASE("device agent on the CPU: one changed key anywhere in rows of every length to 80, every start") {
  // Every row length around a few vectors, every position of the one key unlike the rest,
  // every start alignment: the head / vectors / tail split and the all-or-nothing vector
  // shortcuts, checked against the span the row must have.
  struct Kind {
    ElementType dtype;
    std::uint32_t attend, masked;
  };
  const Kind kinds[] = {{ElementType::boolean, 1, 0},
                        {ElementType::uint8, 0x80, 0},
                        {ElementType::bfloat16, 0, 0xff7f},            // finfo.min
                        {ElementType::float16, 0x8000, 0xf0e2},        // -0 and -1e4
                        {ElementType::float32, 0, 0xff800000u}};      // -inf
  for (const Kind& kind : kinds) {
    const int esize = element_size(kind.dtype);
    const bool finite = is_additive(kind.dtype) && kind.masked != 0xff800000u;
    for (std::int64_t k_len = 1; k_len <= 80; ++k_len) {
      // Rows 0 .. k_len-1: key q attends among masked ones; rows k_len ..: key q is masked.
      const std::int64_t q_len = 2 * k_len;
      std::vector<std::uint64_t> storage(static_cast<std::size_t>((q_len * k_len * esize + 7) / 8));
      auto* bytes = reinterpret_cast<std::uint8_t*>(storage.data());
      for (std::int64_t q = 0; q < q_len; ++q)
        for (std::int64_t k = 0; k < k_len; ++k) {
          const bool lone = k == q % k_len;
          const std::uint32_t v = (q < k_len) == lone ? kind.attend : kind.masked;
          std::uint8_t* p = bytes + (q * k_len + k) * esize;
          if (esize == 1) *p = static_cast<std::uint8_t>(v);
          else store_bits(p, kind.dtype, v);
        }
      const std::int64_t shape[] = {q_len, k_len};
      const MaskView view = *MaskView::contiguous(bytes, kind.dtype, shape);
      for (std::int64_t start = 0; start < 16 / esize; ++start) {
        const Shifted shifted(view, start * esize);
        for (const int threads : {32, 256}) {
          const std::vector<RowSpan> agent = agent_rows(shifted.view, threads);
          for (std::int64_t q = 0; q < q_len; ++q) {
            const std::int64_t at = q % k_len;
            RowSpan want = q < k_len ? RowSpan::interval(at, at)
                                     : merge(RowSpan::interval(0, at - 1), RowSpan::interval(at + 1, k_len - 1));
            const bool any_masked = q >= k_len || k_len > 1;
            if (finite && any_masked) want.flags = kRowFiniteMasked;
            const RowSpan& got = agent[static_cast<std::size_t>(q)];
            INFO(to_string(kind.dtype) << " K=" << k_len << " start +" << start << " threads " << threads << " row "
                                       << q);
            REQUIRE(got.count == want.count);
            REQUIRE(got.same_keys(want));
            REQUIRE(got.flags == want.flags);
          }
        }
      }
    }
  }
}

}  // TEST_SUITE
