// torch.nn.attention.flex_attention: any structure as a BlockMask whose mask_mod is
// the structure's rule (built from its fields by the caller); an arbitrary mask is
// read through its dense tensor in the mask_mod, which keeps flex correct for it. Its
// BlockMask can come from the mask's tile summary (tiles.hpp, BlockMask.from_kv_blocks)
// instead of create_block_mask; decide() charges it on those tiles (cost.hpp).
#pragma once

#include "backend.hpp"

namespace masklens::backends::flex_attention {

inline constexpr std::string_view kDocs = "pytorch docs torch.nn.attention.flex_attention";

inline constexpr Rule kRules[] = {
    {"flex.torch_2_5", kDocs, [](const CallContext& c) { return c.env.torch < version(2, 5); },
     "flex_attention needs torch >= 2.5", [](const CallContext& c) { return "got " + c.env.torch.to_string(); }},
    {"flex.sm", kDocs, before_sm80, "flex_attention's Triton kernels need sm80 or newer here", got_sm},
    {"flex.head_dim", kDocs, [](const CallContext& c) { return c.call.head_dim < 16; },
     "flex_attention needs head_dim >= 16", got_head_dim},
};

inline bool native(const MaskStructure& s, const CallContext&, Call* out) {
  if (s.kind == StructureKind::arbitrary) return false;  // reads the dense mask: see dense
  if (s.has_q_valid()) return false;  // the mask_mod renderers do not carry q_valid yet
  return emit(out, [] { return dropping(Backend::flex_attention, FlexArgs{}, MaskUse::replace); });
}

// A mask_mod returns a bool: it can read a bool mask or an additive one without bias
// values (0 attends), not bias values (those need a score_mod).
inline bool dense(const MaskStructure& s, const CallContext&, Call* out) {
  // Rows masked only by finite values attend uniformly in the dense softmax; a bool
  // mask_mod would leave them empty.
  if (s.bias || s.finite_masked_rows > 0) return false;
  return emit(out, [&s] {
    FlexArgs a;
    a.mask_mod_reads_mask = true;
    // The tiles an arbitrary mask was counted at (and charged on) are the BlockMask's.
    if (s.tile_fractions) a.block_q = s.tile_fractions->block_q, a.block_k = s.tile_fractions->block_k;
    return dropping(Backend::flex_attention, a, MaskUse::keep);
  });
}

}  // namespace masklens::backends::flex_attention
