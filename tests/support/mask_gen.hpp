// Test support: random exact structures and dense masks rendered from them in every
// element type and layout the view accepts. The renderer uses MaskStructure::allows
// (the element-wise definition), never the classifier's interval arithmetic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <masklens/masklens.hpp>

namespace masklens::testing {

using Rng = std::mt19937_64;

// The seed of a randomized test: `fallback`, or MASKLENS_SEED when set (to explore).
inline std::uint64_t test_seed(std::uint64_t fallback) {
  const char* env = std::getenv("MASKLENS_SEED");
  return env ? std::strtoull(env, nullptr, 10) : fallback;
}

inline std::int64_t uniform(Rng& rng, std::int64_t lo, std::int64_t hi) {  // inclusive
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}
inline bool coin(Rng& rng, double p = 0.5) { return std::bernoulli_distribution(p)(rng); }

// A random structure of the given shape; parameters are often not canonical. Modifiers:
// packed documents, padded keys and padded query rows, per batch.
inline MaskStructure random_structure(Rng& rng, std::int64_t batch, std::int64_t q_len, std::int64_t k_len) {
  MaskStructure s;
  s.batch = batch;
  s.heads = 1;
  s.q_len = q_len;
  s.k_len = k_len;
  s.kind = static_cast<StructureKind>(uniform(rng, 0, 5));
  s.alignment = (q_len != k_len && coin(rng)) ? Alignment::bottom_right : Alignment::top_left;
  switch (s.kind) {
    case StructureKind::sliding_window: s.window = uniform(rng, 1, k_len + 2); break;
    case StructureKind::chunked: s.chunk = uniform(rng, 1, k_len + 2); break;
    case StructureKind::prefix_lm: s.prefix = uniform(rng, 1, k_len + 2); break;
    case StructureKind::causal_blocks: {
      std::int64_t at = 0;
      const std::int64_t n = uniform(rng, 1, 3);
      for (std::int64_t i = 0; i < n && at < k_len; ++i) {
        const std::int64_t start = uniform(rng, at, k_len - 1);
        const std::int64_t end = uniform(rng, start + 1, std::min(k_len, start + 1 + k_len / 2));
        s.blocks.push_back({start, end});
        at = end;
      }
      break;
    }
    default: break;
  }
  if (q_len == k_len && q_len > 2 && coin(rng, 0.35)) {
    for (std::int64_t b = 0; b < batch; ++b) {
      std::vector<std::int64_t> cuts{0};
      const std::int64_t n = uniform(rng, 0, std::min<std::int64_t>(4, q_len - 1));
      for (std::int64_t i = 0; i < n; ++i) cuts.push_back(uniform(rng, 1, q_len - 1));
      cuts.push_back(q_len);
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      s.segments.push_back(cuts);
    }
  }
  if (coin(rng, 0.4)) {
    for (std::int64_t b = 0; b < batch; ++b) {
      std::int64_t start = 0, end = k_len;
      switch (uniform(rng, 0, 3)) {
        case 0: start = uniform(rng, 0, k_len - 1); break;           // left padding
        case 1: end = uniform(rng, 1, k_len); break;                  // right padding
        case 2: start = uniform(rng, 0, k_len - 1); end = uniform(rng, start + 1, k_len); break;
        default: break;                                               // this batch unpadded
      }
      s.kv_valid.push_back({start, end});
    }
  }
  if (coin(rng, 0.25)) {
    for (std::int64_t b = 0; b < batch; ++b) {
      std::int64_t start = 0, end = q_len;
      switch (uniform(rng, 0, 3)) {
        case 0: end = uniform(rng, 0, q_len); break;                  // padded queries at the end
        case 1: start = uniform(rng, 0, q_len); break;                // at the start
        case 2: start = uniform(rng, 0, q_len); end = uniform(rng, start, q_len); break;
        default: break;                                               // this batch unpadded
      }
      s.q_valid.push_back({start, end});
    }
  }
  return s;
}

enum class Layout { contiguous, fortran, expand, sliced };
inline const char* to_string(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::fortran: return "fortran";
    case Layout::expand: return "expand";
    case Layout::sliced: return "sliced";
  }
  return "?";
}

// A dense mask in memory and the view of it.
struct DenseMask {
  std::vector<std::uint64_t> storage;  // 8-byte aligned backing store
  MaskView view;
  bool wrote_bias = false;
  std::string describe;
};

enum class Value { allowed, masked, bias };

inline void write_value(std::uint8_t* p, ElementType t, Polarity pol, Value v, int variant) {
  switch (t) {
    case ElementType::boolean:
    case ElementType::uint8:
    case ElementType::int8: {
      const bool attend = v != Value::masked;
      const bool truth = attend == (pol == Polarity::true_attends);
      *p = truth ? static_cast<std::uint8_t>(t == ElementType::boolean ? 1 : 1 + variant % 200) : 0;
      break;
    }
    case ElementType::float16: {
      static constexpr std::uint16_t masked[] = {0xFC00, 0xFBFF, 0xF0E2};  // -inf, -65504, -10000
      const std::uint16_t bits = v == Value::allowed ? (variant % 2 ? 0x8000 : 0x0000)
                                 : v == Value::bias ? 0x3800 : masked[variant % 3];
      std::memcpy(p, &bits, 2);
      break;
    }
    case ElementType::bfloat16: {
      static constexpr std::uint16_t masked[] = {0xFF80, 0xFF7F, 0xC61C};  // -inf, finfo.min, -9984
      const std::uint16_t bits = v == Value::allowed ? 0x0000 : v == Value::bias ? 0xBF00 : masked[variant % 3];
      std::memcpy(p, &bits, 2);
      break;
    }
    case ElementType::float32: {
      const float masked[] = {-std::numeric_limits<float>::infinity(), std::numeric_limits<float>::lowest(), -1e9f};
      const float f = v == Value::allowed ? 0.0f : v == Value::bias ? 0.25f : masked[variant % 3];
      std::memcpy(p, &f, 4);
      break;
    }
  }
}

// Renders `spec` (its batch; heads from `heads`) in the given type and layout.
// float masks use one masked encoding per row so rows never mix -inf and finite values
// unless `mix` is set; `bias_rate` > 0 writes bias values on attending keys.
inline DenseMask render(const MaskStructure& spec, std::int64_t heads, ElementType dtype, Polarity pol,
                        Layout layout, Rng& rng, double bias_rate = 0.0) {
  DenseMask out;
  const std::int64_t B = spec.batch, H = heads, Q = spec.q_len, K = spec.k_len;
  const int esize = element_size(dtype);
  // Physical dims: expand stores one slice and broadcasts; sliced pads every dim.
  std::int64_t pb = B, ph = H, pq = Q, pk = K, off = 0, kstep = 1;
  if (layout == Layout::expand) pb = ph = 1;
  if (layout == Layout::sliced) {
    pq = Q + 2;
    kstep = coin(rng) ? 2 : 1;
    pk = K * kstep + 3;
    off = 1;
  }
  std::array<std::int64_t, 4> strides{};
  if (layout == Layout::fortran) {
    strides = {1, pb, pb * ph, pb * ph * pq};
  } else {
    strides = {ph * pq * pk, pq * pk, pk, kstep};
  }
  const std::int64_t elements = pb * ph * pq * pk + off + 8;
  out.storage.assign(static_cast<std::size_t>((elements * esize + 7) / 8), 0);
  auto* base = reinterpret_cast<std::uint8_t*>(out.storage.data());
  // Fill padding of sliced layouts with junk that would break the verdict if read.
  if (layout == Layout::sliced)
    for (std::int64_t i = 0; i < elements; ++i) write_value(base + i * esize, dtype, pol, Value::allowed, 0);
  const std::uint8_t* data = base + off * esize;
  for (std::int64_t b = 0; b < pb; ++b)
    for (std::int64_t h = 0; h < ph; ++h)
      for (std::int64_t q = 0; q < Q; ++q) {
        const int variant = static_cast<int>(uniform(rng, 0, 5));
        for (std::int64_t k = 0; k < K; ++k) {
          const bool allowed = spec.allows(b, q, k);
          Value v = allowed ? Value::allowed : Value::masked;
          if (allowed && bias_rate > 0 && coin(rng, bias_rate)) {
            v = Value::bias;
            out.wrote_bias = out.wrote_bias || is_additive(dtype);
          }
          const std::int64_t o = b * strides[0] + h * strides[1] + q * strides[2] + k * strides[3];
          write_value(const_cast<std::uint8_t*>(data) + o * esize, dtype, pol, v, variant);
        }
      }
  const std::int64_t shape[4] = {pb, ph, Q, K};
  MaskEncoding enc;
  enc.polarity = is_additive(dtype) ? Polarity::true_attends : pol;
  auto view = MaskView::make(data, dtype, shape, strides, enc);
  if (view && layout == Layout::expand) view = view->broadcast_to(B, H);
  out.view = *view;
  out.describe = std::string(to_string(spec.kind)) + " " + std::string(to_string(dtype)) + " " +
                 to_string(layout) + " B=" + std::to_string(B) + " H=" + std::to_string(H) +
                 " Q=" + std::to_string(Q) + " K=" + std::to_string(K);
  return out;
}

// The structure a broadcast batch stands for: `spec` of batch 1 repeated over `batch`.
inline MaskStructure repeat_batches(MaskStructure spec, std::int64_t batch) {
  spec.batch = batch;
  if (spec.has_segments()) spec.segments.assign(static_cast<std::size_t>(batch), spec.segments[0]);
  if (spec.has_kv_valid()) spec.kv_valid.assign(static_cast<std::size_t>(batch), spec.kv_valid[0]);
  if (spec.has_q_valid()) spec.q_valid.assign(static_cast<std::size_t>(batch), spec.q_valid[0]);
  return spec;
}

// True when `verdict` says exactly what the view holds, element by element.
inline bool renders_equal(const MaskStructure& verdict, const MaskView& view) {
  for (std::int64_t b = 0; b < view.batch(); ++b)
    for (std::int64_t h = 0; h < view.heads(); ++h)
      for (std::int64_t q = 0; q < view.q_len(); ++q)
        for (std::int64_t k = 0; k < view.k_len(); ++k)
          if (verdict.allows(b, q, k) != attends(view.at(b, h, q, k))) return false;
  return true;
}

inline std::int64_t count_empty_rows(const MaskStructure& spec, std::int64_t heads) {
  std::int64_t n = 0;
  for (std::int64_t b = 0; b < spec.batch; ++b)
    for (std::int64_t q = 0; q < spec.q_len; ++q) n += spec.row(b, q).empty() ? heads : 0;
  return n;
}

// The keys row q of batch b attends under a call that drops or replaces the mask,
// computed from the typed call alone (the library's documented semantics of each
// argument), for a slice of q_len x k_len. Flex calls build their mask from the
// structure itself: `structure_row` is their answer.
inline RowSpan call_row(const Call& c, std::int64_t b, std::int64_t q, std::int64_t q_len, std::int64_t k_len,
                        const RowSpan& structure_row) {
  // A band on one sequence of lq x lk rows: bottom-right (or top-left) causal, a window, a chunk.
  const auto band = [](std::int64_t ql, std::int64_t lq, std::int64_t lk, bool causal, bool bottom_right,
                       std::int64_t wl, std::int64_t wr, std::int64_t chunk) {
    const std::int64_t p = ql + (bottom_right ? lk - lq : 0);
    std::int64_t lo = 0, hi = lk - 1;
    if (causal || wr >= 0) hi = std::min(hi, p + std::max<std::int64_t>(wr, 0));
    if (wl >= 0) lo = std::max(lo, p - wl);
    if (chunk > 0) {
      if (p < 0) return RowSpan{};
      lo = std::max(lo, p / chunk * chunk);
    }
    return RowSpan::interval(lo, hi);
  };
  if (const auto* a = c.get<SdpaArgs>()) {
    if (a->is_causal) return RowSpan::interval(0, std::min(q, k_len - 1));
    if (a->causal_lower_right) return RowSpan::interval(0, std::min(q + k_len - q_len, k_len - 1));
    return RowSpan::interval(0, k_len - 1);
  }
  if (const auto* a = c.get<KernelArgs>())
    return band(q, q_len, k_len, a->causal, a->alignment == Alignment::bottom_right, a->window_left,
                a->causal ? 0 : a->window_right, a->chunk);
  if (const auto* a = c.get<VarlenArgs>()) {
    for (const Sequence& s : a->sequences) {
      if (s.batch != b || q < s.q.start || q >= s.q.end) continue;
      const RowSpan local = band(q - s.q.start, s.q.end - s.q.start, s.k.end - s.k.start, a->causal,
                                 a->alignment == Alignment::bottom_right,
                                 a->window_left, a->causal ? 0 : a->window_right, 0);
      return local.empty() ? local : RowSpan::interval(local.first + s.k.start, local.last + s.k.start);
    }
    return RowSpan{};  // rows no sequence covers
  }
  if (c.get<FlexArgs>()) return structure_row;
  return RowSpan{};  // zeros
}

// A call that drops the mask computes the structure exactly: every row of every batch.
inline bool call_is_exact(const MaskStructure& s, const Call& c) {
  if (c.mask == MaskUse::keep) return false;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t q = 0; q < s.q_len; ++q)
      if (!call_row(c, b, q, s.q_len, s.k_len, s.row(b, q)).same_keys(s.row(b, q))) return false;
  return true;
}

// A plan rendered back to row intervals equals the structure, every row covered once.
inline bool plan_is_exact(const MaskStructure& s, const Policy& p) {
  std::vector<std::vector<int>> covered(static_cast<std::size_t>(s.batch), std::vector<int>(static_cast<std::size_t>(s.q_len), 0));
  for (const PlanStep& step : p.plan) {
    const std::int64_t q_len = step.q_range.end - step.q_range.start, k_len = step.k_range.end - step.k_range.start;
    if (step.call.mask == MaskUse::keep) return false;
    for (std::int64_t q = step.q_range.start; q < step.q_range.end; ++q) {
      covered[static_cast<std::size_t>(step.batch)][static_cast<std::size_t>(q)]++;
      const RowSpan local = call_row(step.call, 0, q - step.q_range.start, q_len, k_len, RowSpan{});
      const RowSpan got = local.empty() ? local
                                        : RowSpan::interval(local.first + step.k_range.start, local.last + step.k_range.start);
      if (!got.same_keys(s.row(step.batch, q))) return false;
    }
  }
  for (const auto& rows : covered)
    for (int c : rows)
      if (c != 1) return false;
  return true;
}

}  // namespace masklens::testing
