// libFuzzer: decide() on any structure and any call holds the policy's invariants: the
// chosen backend is available and refuses nothing, a dropped mask is never one that
// must stay, a plan renders back to the structure row for row, and every other backend
// is accounted for once, with a reason and a source. A malformed structure (one field
// broken at a time) is an error naming it, never a crash.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>

#include "../support/mask_gen.hpp"

namespace {

using namespace masklens;

// Reads small numbers off the input; zeros once it runs out.
struct Bytes {
  const std::uint8_t* p;
  std::size_t n;
  std::uint32_t next(std::uint32_t bound) {  // in [0, bound)
    std::uint32_t v = 0;
    for (int i = 0; i < 2 && n > 0; ++i, ++p, --n) v = v << 8 | *p;
    return bound ? v % bound : 0;
  }
};

MaskStructure structure(Bytes& in) {
  MaskStructure s;
  s.batch = 1 + in.next(3);
  const bool large = in.next(32) == 1;  // lengths past the 32-bit defects' bounds (slow to check: rare,
                                         // and not what an exhausted input reads: zeros)
  s.q_len = large ? 69632 - in.next(3) : 1 + in.next(48);
  s.k_len = in.next(2) ? s.q_len : (large ? 69632 + 16 * in.next(4096) : 1 + in.next(48));
  s.kind = static_cast<StructureKind>(in.next(7));
  s.alignment = s.q_len != s.k_len && in.next(2) ? Alignment::bottom_right : Alignment::top_left;
  s.window = 1 + in.next(static_cast<std::uint32_t>(std::min<std::int64_t>(s.k_len, 60000)));
  s.chunk = 1 + in.next(static_cast<std::uint32_t>(std::min<std::int64_t>(s.k_len, 60000)));
  s.prefix = 1 + in.next(static_cast<std::uint32_t>(std::min<std::int64_t>(s.k_len, 60000)));
  if (s.kind == StructureKind::causal_blocks) {
    const std::int64_t start = in.next(static_cast<std::uint32_t>(s.k_len));
    s.blocks = {{start, start + 1 + in.next(static_cast<std::uint32_t>(s.k_len - start))}};
  }
  const bool structured = s.kind != StructureKind::arbitrary;
  // Modifiers per batch, or one entry for every batch.
  const std::int64_t entries = in.next(4) == 0 ? 1 : s.batch;
  if (structured && s.q_len == s.k_len && s.q_len > 2 && in.next(3) == 0)
    for (std::int64_t b = 0; b < entries; ++b) {
      const std::int64_t cut = 1 + in.next(static_cast<std::uint32_t>(s.q_len - 1));
      s.segments.push_back({0, cut, s.q_len});
    }
  if (structured && in.next(3) == 0)
    for (std::int64_t b = 0; b < entries; ++b) {
      const std::int64_t start = in.next(static_cast<std::uint32_t>(s.k_len));
      s.kv_valid.push_back({start, start + 1 + in.next(static_cast<std::uint32_t>(s.k_len - start))});
    }
  s.bias = in.next(6) == 0;
  // An arbitrary mask's tile shares, as its scan would count them.
  if (!structured && in.next(2)) {
    const double partial = in.next(101) / 100.0;
    s.tile_fractions = TileFractions{1 + in.next(256), 1 + in.next(256), partial,
                                     in.next(static_cast<std::uint32_t>(101 - partial * 100 + 0.5)) / 100.0};
  }
  // Counts: an arbitrary structure's are given; a structured one implies its empty rows
  // (given as that count, or 0 = "derive it").
  const std::int64_t rows = s.batch * s.heads * s.q_len;
  if (!structured && in.next(4) == 0) s.empty_rows = 1 + in.next(static_cast<std::uint32_t>(std::min<std::int64_t>(rows, 100)));
  if (structured && in.next(2)) s.empty_rows = s.implied_empty_rows();
  const std::int64_t empty = structured ? s.implied_empty_rows() : s.empty_rows;
  if (empty && in.next(2)) s.finite_masked_rows = in.next(static_cast<std::uint32_t>(std::min<std::int64_t>(empty, 60000) + 1));
  return s;
}

// Breaks one field of a well-formed structure, the way a caller or a file could.
void break_one_field(MaskStructure& s, Bytes& in) {
  switch (in.next(17)) {
    case 0: s.kind = StructureKind::chunked; s.chunk = -static_cast<std::int64_t>(in.next(2)); break;  // 0 divides
    case 1: s.kind = StructureKind::sliding_window; s.window = in.next(2) ? 0 : INT64_MAX; break;
    case 2: s.kind = StructureKind::prefix_lm; s.prefix = -1; break;
    case 3: s.kind = StructureKind::causal_blocks; s.blocks = {{3, 5}, {4, 6}}; break;  // overlapping
    case 4: s.kind = StructureKind::causal_blocks; s.blocks = {{0, s.k_len + 1}}; break;
    case 5: s.kind = StructureKind::causal_blocks; s.blocks.clear(); break;
    case 6:  // more entries than batches, and not one for all
      s.kind = StructureKind::causal;
      s.kv_valid.assign(static_cast<std::size_t>(s.batch + 1), KeyRange{0, s.k_len});
      break;
    case 7:  // fewer: reading segments[b] past the end
      s.batch = 3 + in.next(4);
      s.q_len = s.k_len;
      s.kind = StructureKind::causal;
      s.segments.assign(2, {0, s.q_len});
      s.kv_valid.clear();
      break;
    case 8: s.kv_valid.assign(1, KeyRange{static_cast<std::int64_t>(in.next(3)) - 2, s.k_len + in.next(2)}); break;
    case 9: s.kv_valid.assign(1, KeyRange{2, 1}); break;
    case 10:  // not rising, or not ending at Q, or Q != K
      s.kind = StructureKind::causal;
      s.segments.assign(1, in.next(2) ? std::vector<std::int64_t>{0, 0, s.q_len} : std::vector<std::int64_t>{0, s.q_len + 1});
      break;
    case 11: s.kind = StructureKind::arbitrary; s.kv_valid.assign(1, KeyRange{0, s.k_len}); break;
    case 12: s.empty_rows = s.kind == StructureKind::arbitrary ? -1 : s.implied_empty_rows() + 1 + in.next(5); break;
    case 13: s.finite_masked_rows = s.empty_rows + 1 + in.next(5); s.kind = StructureKind::arbitrary;
             s.segments.clear(); s.kv_valid.clear(); break;
    case 14: (in.next(2) ? s.q_len : s.batch) = -static_cast<std::int64_t>(in.next(2)); break;
    case 15:  // tile shares out of range, or on an exact kind
      s.tile_fractions = TileFractions{static_cast<std::int64_t>(in.next(2)), 128, in.next(2) ? -0.5 : 0.75, 0.5};
      break;
    default: s.kind = static_cast<StructureKind>(7 + in.next(9)); break;  // 16: an unknown kind
  }
}

CallContext call(Bytes& in) {
  static constexpr std::int64_t kHeadDims[] = {8, 16, 60, 64, 72, 96, 128, 192, 200, 256, 264, 512};
  static constexpr int kSms[] = {75, 80, 86, 89, 90, 100, 103};
  CallContext context;
  AttentionCall& c = context.call;
  Environment& e = context.env;
  c.dtype = static_cast<DType>(in.next(3));
  c.head_dim = kHeadDims[in.next(std::size(kHeadDims))];
  if (in.next(4) == 0) c.head_dim_v = kHeadDims[in.next(std::size(kHeadDims))];
  c.heads = 1 + in.next(32);
  c.kv_heads = in.next(2) ? 0 : 1 + in.next(static_cast<std::uint32_t>(c.heads));
  if (c.kv_heads && c.heads % c.kv_heads) c.kv_heads = 0;
  c.training = in.next(2);
  c.dropout = in.next(4) == 0 ? 0.1 : 0.0;
  c.deterministic = in.next(8) == 0;
  if (in.next(3) == 0) c.mask_dtype = static_cast<ElementType>(in.next(6));
  e.sm = kSms[in.next(std::size(kSms))];
  e.torch = version(2, static_cast<int>(3 + in.next(10)));
  e.cudnn = version(9, static_cast<int>(in.next(27)));
  e.available = in.next(256) | kFamilyTorch * in.next(2);
  if (in.next(2)) e.flash_attn = version(2, 8);
  if (in.next(2)) e.flash_attn3 = version(3, 0);
  if (in.next(2)) e.xformers = version(0, 0, 33);
  if (in.next(2)) e.transformer_engine = version(2, 8);
  if (in.next(2)) e.flashinfer = version(0, 5);
  if (in.next(2)) e.cudnn_frontend = version(1, 16);
  return context;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in{data, size};
  MaskStructure s = structure(in);
  if (in.next(5) == 0) break_one_field(s, in);
  const CallContext c = call(in);
  const Result<Policy> p = decide(s, c.call, c.env);
  if (const Status invalid = s.validate(); !invalid.ok()) {
    // Refused as validate() refuses it, with a message.
    if (p || p.status().code() != invalid.code() || p.status().message() != invalid.message()) __builtin_trap();
    return 0;
  }
  if (!p) return 0;  // no available backend computes it: allowed, e.g. nothing installed
  const CallContext effective{effective_call(s, c.call), c.env};
  const bool must_keep = s.kind == StructureKind::arbitrary || s.bias || s.finite_masked_rows > 0;
  if (must_keep && p->call.mask != MaskUse::keep) __builtin_trap();
  if (p->plan.empty()) {
    if (!c.env.has(family(p->backend())) || refusals(p->backend(), effective).any()) __builtin_trap();
    // A call that drops or replaces the mask computes the structure exactly.
    if (p->call.mask != MaskUse::keep && !masklens::testing::call_is_exact(s, p->call)) __builtin_trap();
    // A kept mask is passed as a type its kernel takes (docs/backends.md, Mask dtypes).
    if (p->call.mask == MaskUse::keep && c.call.mask_dtype && family(p->backend()) == kFamilyTorch) {
      const ElementType passed = p->call.mask_cast.value_or(*c.call.mask_dtype);
      if (passed != ElementType::boolean && passed != ElementType::float32 && passed != c.call.query_element())
        __builtin_trap();
    }
  } else if (!masklens::testing::plan_is_exact(s, *p)) {
    __builtin_trap();
  }
  // Each backend once (a plan that lost is one more entry, named by its lead backend).
  std::set<Backend> seen;
  int lost_plans = 0;
  for (const Rejection& r : p->rejected) {
    if (r.reason().empty() || r.source.empty()) __builtin_trap();
    if (r.kind == RejectionKind::slower && r.usage == Usage::plan_step) {
      if (++lost_plans > 1 || !p->plan.empty()) __builtin_trap();
      continue;
    }
    if (!seen.insert(r.backend).second) __builtin_trap();
    if (p->plan.empty() && r.backend == p->backend()) __builtin_trap();
  }
  if (seen.size() + (p->plan.empty() ? 1 : 0) != std::size(kAllBackends)) __builtin_trap();
  return 0;
}
