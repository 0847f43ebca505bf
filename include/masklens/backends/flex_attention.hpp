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
    // Its signature has no dropout: a call with dropout must not lose it silently.
    {"flex.dropout", kDocs, [](const CallContext& c) { return c.call.dropout > 0; },
     "flex_attention takes no dropout"},
};

inline bool native(const MaskStructure& s, const CallContext&, Call* out) {
  if (s.kind == StructureKind::arbitrary) return false;  // reads the dense mask: see dense
  // Rows that attend nothing (q_valid) are in the rule (mask_rule.hpp): the mask_mod
  // leaves them empty and the drop-in zeroes their output, as the dense path does.
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


// create_block_mask's arguments: a kept mask may differ per head, so its block mask
// then spans the mask's heads.
inline CallArgs args(const Call& call, std::int64_t batch, std::int64_t q_len, std::int64_t k_len) {
  CallArgs out;
  const FlexArgs* flex = call.get<FlexArgs>();
  if (!flex) return out;
  out.mask_object = "create_block_mask";
  out.mask_object_args = {{"B", batch}, {"H", Identifier{flex->mask_mod_reads_mask ? "mask.shape[1]" : "None"}},
                          {"Q_LEN", q_len}, {"KV_LEN", k_len},
                          {"BLOCK_SIZE", IntPair{flex->block_q, flex->block_k}}};
  return out;
}

// `def mask_mod(...)` for flex_attention: the structure's rule from its fields, with
// the tensors it reads bound first; a kept mask is read through `mask`. `s` must be
// spelled out (one modifier entry per batch). create_block_mask evaluates whole tiles,
// past Q and K when they are not multiples of the block: lookups use clamped indices.
inline std::string python_mask_mod(const MaskStructure& s, const Call& c, std::optional<ElementType> mask_dtype) {
  const std::string q_last = std::to_string(s.q_len - 1), k_last = std::to_string(s.k_len - 1);
  if (c.get<FlexArgs>() && c.get<FlexArgs>()->mask_mod_reads_mask) {
    const bool is_bool = !mask_dtype || !is_additive(*mask_dtype);
    return "def mask_mod(b, h, q_idx, kv_idx):\n    m = mask[b if mask.shape[0] > 1 else 0, h if mask.shape[1] > 1 else 0, "
           "q_idx.clamp(max=" + q_last + "), kv_idx.clamp(max=" + k_last + ")]\n    return " +
           (is_bool ? "m" : "m == 0") + "\n";
  }
  // The rule of mask_rule.hpp with its numbers written in, after the tables it reads.
  const std::int64_t d = rule_offset(s), n = block_table_length(s);
  PythonOperands o;
  if (d) o.p = "(q_idx + " + std::to_string(d) + ")";
  o.key_last = k_last, o.block_last = std::to_string(n - 1), o.document_last = q_last;
  std::string setup;
  for (std::string_view table : python_tables(s)) {
    if (table == "block_id") {
      setup += "block_id = torch.full((" + std::to_string(n) + ",), -1, dtype=torch.int32, device=q.device)\n";
      for (std::size_t i = 0; i < s.blocks.size(); ++i)
        setup += "block_id[" + std::to_string(s.blocks[i].start) + ":" + std::to_string(s.blocks[i].end) +
                 "] = " + std::to_string(i) + "\n";
    } else if (table == "document_id") {
      setup += "document_id = torch.zeros(" + std::to_string(s.batch) + ", " + std::to_string(s.q_len) +
               ", dtype=torch.int32, device=q.device)\n";
      for (std::int64_t b = 0; b < s.batch; ++b) {
        const auto& seg = s.segments_of(b);
        for (std::size_t i = 1; i + 1 < seg.size(); ++i)
          setup += "document_id[" + std::to_string(b) + ", " + std::to_string(seg[i]) + ":] += 1\n";
      }
    } else if (table == "kv_start" || table == "q_start") {
      const bool keys = table == "kv_start";
      std::vector<std::int64_t> starts, ends;
      for (std::int64_t b = 0; b < s.batch; ++b) {
        const KeyRange& r = keys ? s.kv_valid_of(b) : s.q_valid_of(b);
        starts.push_back(r.start), ends.push_back(r.end);
      }
      const std::string name = keys ? "kv" : "q";
      setup += name + "_start = torch.tensor(" + python_text::python_list(starts) + ", device=q.device)\n" + name +
               "_end = torch.tensor(" + python_text::python_list(ends) + ", device=q.device)\n";
    }
  }
  const std::string rule = python_rule(s, o);
  return setup + "def mask_mod(b, h, q_idx, kv_idx):\n    return " + rule + "\n";
}

// The mask_mod (for a single call, whose structure is known), the BlockMask and the call.
inline std::string python(const PythonCall& p) {
  std::string mask_mod;
  if (p.structure) {
    // The mask_mod indexes its tensors per batch: one modifier entry per batch.
    const Result<MaskStructure> spelled = spell_out(*p.structure);
    mask_mod = python_mask_mod(spelled ? *spelled : *p.structure, p.call, p.mask_dtype) + "\n";
  }
  // A mask_mod that reads the mask: create_block_mask evaluates it on index grids of the
  // mask's size (out of memory past about 2^31 elements, pytorch#134756), where masklens
  // builds the same BlockMask from one read of the mask.
  const FlexArgs* flex = p.call.get<FlexArgs>();
  const std::string one_read =
      flex && flex->mask_mod_reads_mask
          ? "# the same BlockMask from one read of the mask: block_mask = masklens.torch.block_mask(mask, (" +
                std::to_string(flex->block_q) + ", " + std::to_string(flex->block_k) + "))\n"
          : "";
  return mask_mod + one_read + "block_mask = create_block_mask(mask_mod" + python_text::keywords(p.args.mask_object_args) +
         ")\nout = flex_attention(q, k, v, block_mask=block_mask)";
}

}  // namespace masklens::backends::flex_attention
