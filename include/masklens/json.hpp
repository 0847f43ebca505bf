// Optional JSON support (needs nlohmann-json; the core headers never include this):
// the CLI's --json contract, schema 2 (docs/json.md).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "call_args.hpp"
#include "policy.hpp"
#include "status.hpp"
#include "structure.hpp"
#include "tiles.hpp"

namespace masklens {

inline constexpr int kJsonSchema = 2;

inline nlohmann::json to_json(const ArgValue& v) {
  return std::visit(
      [](const auto& x) -> nlohmann::json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, IntPair>) return nlohmann::json::array({x.first, x.second});
        else if constexpr (std::is_same_v<T, IndexTensor>) return nlohmann::json(x.values);
        else if constexpr (std::is_same_v<T, Identifier>) return nlohmann::json(std::string(x.text));
        else if constexpr (std::is_same_v<T, std::string_view>) return nlohmann::json(std::string(x));
        else return nlohmann::json(x);
      },
      v);
}

inline nlohmann::json to_json(const std::vector<NamedArg>& args) {
  nlohmann::json j = nlohmann::json::object();
  for (const NamedArg& a : args) j[std::string(a.name)] = to_json(a.value);
  return j;
}

// The typed call's fields, as a binding reads them.
inline nlohmann::json typed_call_json(const Call& c) {
  return std::visit(
      [](const auto& a) -> nlohmann::json {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, SdpaArgs>) {
          return {{"type", "sdpa"}, {"kernel", std::string(to_string(a.kernel))}, {"is_causal", a.is_causal},
                  {"causal_lower_right", a.causal_lower_right}, {"enable_gqa", a.enable_gqa}};
        } else if constexpr (std::is_same_v<T, KernelArgs>) {
          return {{"type", "kernel"}, {"causal", a.causal}, {"alignment", std::string(to_string(a.alignment))},
                  {"window_left", a.window_left}, {"window_right", a.window_right}, {"chunk", a.chunk}};
        } else if constexpr (std::is_same_v<T, VarlenArgs>) {
          nlohmann::json seqs = nlohmann::json::array();
          for (const Sequence& q : a.sequences) seqs.push_back({q.batch, q.q.start, q.q.end, q.k.start, q.k.end});
          nlohmann::json j = {{"type", "varlen"},          {"sequences", std::move(seqs)},
                              {"packed", a.packed},        {"causal", a.causal},
                              {"window_left", a.window_left}, {"window_right", a.window_right}};
          // Written only where it is not the varlen kernels' bottom-right (JAX's padded call).
          if (a.alignment == Alignment::top_left) j["alignment"] = "top_left";
          return j;
        } else if constexpr (std::is_same_v<T, FlexArgs>) {
          return {{"type", "flex"}, {"block", {a.block_q, a.block_k}}, {"mask_mod_reads_mask", a.mask_mod_reads_mask}};
        } else {
          return {{"type", "zeros"}};
        }
      },
      c.args);
}

// One call: backend, what happens to the mask, the typed call and its own arguments.
inline nlohmann::json to_json(const Call& c, std::int64_t batch, std::int64_t q_len, std::int64_t k_len) {
  const CallArgs rendered = backend_args(c, batch, q_len, k_len);
  nlohmann::json j;
  j["backend"] = std::string(to_string(c.backend));
  j["mask"] = std::string(to_string(c.mask));
  j["mask_cast"] = c.mask_cast ? nlohmann::json(std::string(to_string(*c.mask_cast))) : nlohmann::json(nullptr);
  j["mask_form"] = std::string(to_string(c.mask_form));
  j["call"] = typed_call_json(c);
  j["args"] = to_json(rendered.args);
  j["mask_object"] = rendered.mask_object.empty()
                         ? nlohmann::json(nullptr)
                         : nlohmann::json{{"name", std::string(rendered.mask_object)},
                                          {"args", to_json(rendered.mask_object_args)}};
  return j;
}

inline nlohmann::json to_json(const MaskStructure& s) {
  nlohmann::json j;
  j["kind"] = std::string(to_string(s.kind));
  if (s.kind != StructureKind::full && s.kind != StructureKind::arbitrary) j["alignment"] = std::string(to_string(s.alignment));
  if (s.kind == StructureKind::sliding_window) j["window"] = s.window;
  if (s.kind == StructureKind::chunked) j["chunk"] = s.chunk;
  if (s.kind == StructureKind::prefix_lm) j["prefix"] = s.prefix;
  if (s.kind == StructureKind::causal_blocks) {
    j["blocks"] = nlohmann::json::array();
    for (const KeyRange& r : s.blocks) j["blocks"].push_back({r.start, r.end});
  }
  j["segments"] = s.has_segments() ? nlohmann::json(s.segments) : nlohmann::json(nullptr);
  const auto ranges = [](const std::vector<KeyRange>& list) {
    if (list.empty()) return nlohmann::json(nullptr);
    nlohmann::json out = nlohmann::json::array();
    for (const KeyRange& r : list) out.push_back({r.start, r.end});
    return out;
  };
  j["kv_valid"] = ranges(s.kv_valid);
  j["q_valid"] = ranges(s.q_valid);
  j["empty_rows"] = s.empty_rows;
  j["finite_masked_rows"] = s.finite_masked_rows;
  j["bias"] = s.bias;
  // Written only when known (an arbitrary mask whose tiles were counted), so documents
  // of masks without a tile summary read as before.
  if (s.tile_fractions)
    j["tile_fractions"] = {{"block", {s.tile_fractions->block_q, s.tile_fractions->block_k}},
                           {"partial", s.tile_fractions->partial},
                           {"full", s.tile_fractions->full}};
  return j;
}

namespace detail {

// A flat row-major tensor as nested JSON arrays of its shape.
inline nlohmann::json nested(const std::int32_t* data, const std::int64_t* shape, int rank) {
  nlohmann::json out = nlohmann::json::array();
  if (rank == 1) {
    for (std::int64_t i = 0; i < shape[0]; ++i) out.push_back(data[i]);
    return out;
  }
  std::int64_t inner = 1;
  for (int d = 1; d < rank; ++d) inner *= shape[d];
  for (std::int64_t i = 0; i < shape[0]; ++i) out.push_back(nested(data + i * inner, shape + 1, rank - 1));
  return out;
}

}  // namespace detail

// A tile summary as the inspect document's "tiles" (docs/json.md): the block size, the
// lengths, the stored slices' shape, the tile counts and torch BlockMask's eight tensors
// as nested int32 lists (torch.tensor(doc["tiles"]["kv_indices"], dtype=torch.int32)).
inline nlohmann::json to_json(const BlockMaskTensors& t, const TileTally& tally) {
  nlohmann::json j;
  const TileGrid& g = t.grid;
  j["block"] = {g.block_q, g.block_k};
  j["seq_lengths"] = {g.q_len, g.k_len};
  j["shape"] = {g.distinct_batch, g.distinct_heads, g.q_tiles(), g.k_tiles()};
  j["counts"] = {{"empty", tally.empty}, {"partial", tally.partial}, {"full", tally.full}};
  for (BlockMaskField f : kBlockMaskFields) {
    const Int32Tensor x = t.tensor(f);
    j[std::string(to_string(f))] = detail::nested(x.data, x.shape.data(), x.rank);
  }
  return j;
}

inline nlohmann::json to_json(const Policy& p, const MaskStructure& s) {
  nlohmann::json j = to_json(p.call, s.batch, s.q_len, s.k_len);
  j["cost_ms"] = p.cost_ms;
  if (p.plan.empty()) {
    j["plan"] = nullptr;
  } else {
    j["plan"] = nlohmann::json::array();
    for (const PlanStep& st : p.plan) {
      nlohmann::json step = to_json(st.call, 1, st.q_range.end - st.q_range.start, st.k_range.end - st.k_range.start);
      step["batch"] = st.batch;
      step["q_range"] = {st.q_range.start, st.q_range.end};
      step["k_range"] = {st.k_range.start, st.k_range.end};
      j["plan"].push_back(std::move(step));
    }
  }
  j["rejected"] = nlohmann::json::array();
  for (const Rejection& r : p.rejected) {
    nlohmann::json x{{"backend", std::string(to_string(r.backend))},
                     {"kind", std::string(to_string(r.kind))},
                     {"reason", r.reason()},
                     {"source", std::string(r.source)}};
    if (r.kind == RejectionKind::refused) {
      x["rules"] = nlohmann::json::array();
      r.refusals.for_each([&](const Rule& rule) { x["rules"].push_back(std::string(rule.name)); });
    }
    if (r.kind == RejectionKind::defect) x["defect"] = std::string(r.defect->id);
    if (r.kind == RejectionKind::slower) x["cost_ms"] = r.cost_ms;
    j["rejected"].push_back(std::move(x));
  }
  j["hazards"] = nlohmann::json::array();
  for (const Hazard& h : p.hazards) j["hazards"].push_back({{"kind", std::string(to_string(h.kind))}, {"detail", h.detail}});
  return j;
}

// The whole --json document.
inline nlohmann::json to_json(const MaskStructure& s, const Policy* policy) {
  nlohmann::json j;
  j["schema"] = kJsonSchema;
  j["shape"] = {s.batch, s.heads, s.q_len, s.k_len};
  j["structure"] = to_json(s);
  j["policy"] = policy ? to_json(*policy, s) : nlohmann::json(nullptr);
  return j;
}

namespace detail {

// An integer field as int64. JSON integers from 2^63 to 2^64 parse as unsigned: they
// are refused as written, not wrapped to negatives.
inline Result<std::int64_t> int_from_json(const nlohmann::json& v, const std::string& where) {
  if (!v.is_number_integer()) return error(ErrorCode::parse_error, where + " must be an integer");
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
    return error(ErrorCode::invalid_argument, where + " must be at most 2^63 - 1, got " + v.dump());
  return v.get<std::int64_t>();
}

inline Result<KeyRange> range_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_array() || j.size() != 2 || !j[0].is_number_integer() || !j[1].is_number_integer())
    return error(ErrorCode::parse_error, where + " must be [start, end] with two integers");
  auto start = int_from_json(j[0], where + "[0]");
  if (!start) return start.status();
  auto end = int_from_json(j[1], where + "[1]");
  if (!end) return end.status();
  return KeyRange{*start, *end};
}

// A per-batch list holds one entry for every batch or one per batch: an empty one says
// nothing, which is no structure (null or leaving the key out says "none").
inline Status non_empty_list(const nlohmann::json& j, const std::string& where, std::int64_t batch) {
  if (j.is_array() && j.empty())
    return error(ErrorCode::invalid_argument, where + " must list one entry per batch (" + std::to_string(batch) +
                                                  ") or a single one for all batches, got 0 (null or no key: none)");
  return {};
}

inline Result<std::vector<KeyRange>> ranges_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_array()) return error(ErrorCode::parse_error, where + " must be an array of [start, end]");
  std::vector<KeyRange> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    auto r = range_from_json(j[i], where + "[" + std::to_string(i) + "]");
    if (!r) return r.status();
    out.push_back(*r);
  }
  return out;
}

inline Result<std::int64_t> integer(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return error(ErrorCode::parse_error, std::string("structure.") + key + " must be an integer");
  return int_from_json(j[key], std::string("structure.") + key);
}

// A string from the input as a message quotes it: control characters (a NUL, which ends
// a C string and would cut the message there; a newline) written as JSON escapes.
inline std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

// Every key of a structure object is one the reader knows, and a kind's own parameter
// (window, chunk, prefix, blocks; alignment) appears only on the kinds that take it: a
// misspelt "kv_vaild" or a "window" on a causal structure would otherwise be dropped
// and the advice given for another mask. A null value is a key left out.
inline Status check_structure_keys(const nlohmann::json& j, StructureKind kind) {
  static constexpr std::string_view kKeys[] = {"kind",     "alignment", "window",     "chunk",
                                               "prefix",   "blocks",    "segments",   "kv_valid",
                                               "q_valid",  "empty_rows", "finite_masked_rows", "bias",
                                               "tile_fractions"};
  for (const auto& [key, value] : j.items()) {
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      return error(ErrorCode::parse_error,
                   "structure." + printable(key) + " is not a structure field (kind, alignment, window, chunk, prefix, blocks, "
                                        "segments, kv_valid, q_valid, empty_rows, finite_masked_rows, bias, tile_fractions)");
  }
  const std::pair<const char*, StructureKind> owned[] = {{"window", StructureKind::sliding_window},
                                                         {"chunk", StructureKind::chunked},
                                                         {"prefix", StructureKind::prefix_lm},
                                                         {"blocks", StructureKind::causal_blocks}};
  for (const auto& [key, owner] : owned)
    if (kind != owner && j.contains(key) && !j[key].is_null())
      return error(ErrorCode::parse_error, std::string("structure.") + key + " applies to " +
                                               std::string(to_string(owner)) + ", not " + std::string(to_string(kind)));
  if ((kind == StructureKind::full || kind == StructureKind::arbitrary) && j.contains("alignment") &&
      !j["alignment"].is_null())
    return error(ErrorCode::parse_error, "structure.alignment applies to the causal kinds, not " +
                                             std::string(to_string(kind)) + " (which attends alike either way)");
  return {};
}

// A whole inspect document holds these besides its structure (docs/json.md), and says
// which schema it is written in and the shape its structure describes: a document of
// another schema, or of another mask's query and key lengths (its kv_valid ranges,
// segments and blocks are positions in that mask), is refused, not read as this shape's.
// Its batch and heads may be 1 where the shape has more (a structure of batch 1 describes
// every batch, as SDPA broadcasts a mask).
inline Status check_document(const nlohmann::json& doc, std::int64_t batch, std::int64_t heads, std::int64_t q_len,
                             std::int64_t k_len) {
  static constexpr std::string_view kKeys[] = {"schema", "shape", "structure", "policy", "tiles"};
  for (const auto& [key, value] : doc.items())
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      return error(ErrorCode::parse_error, "'" + printable(key) + "' is not a key of an inspect document (schema, "
                                                                  "shape, structure, policy, tiles)");
  if (!doc.contains("schema") || !doc.contains("shape"))
    return error(ErrorCode::parse_error, "an inspect document gives its \"schema\" (" + std::to_string(kJsonSchema) +
                                             ") and \"shape\" [B, H, Q, K]; pass the structure object alone to "
                                             "read it for any shape");
  if (!doc["schema"].is_number_integer() || doc["schema"].get<std::int64_t>() != kJsonSchema)
    return error(ErrorCode::parse_error, "the inspect document has schema " + printable(doc["schema"].dump()) +
                                             "; this masklens reads schema " + std::to_string(kJsonSchema) +
                                             " (docs/json.md): inspect the mask again");
  const nlohmann::json& shape = doc["shape"];
  const bool four_integers = shape.is_array() && shape.size() == 4 &&
                             std::all_of(shape.begin(), shape.end(), [](const auto& n) { return n.is_number_integer(); });
  if (!four_integers)
    return error(ErrorCode::parse_error, "the inspect document's shape must be [B, H, Q, K], four integers, got " +
                                             printable(shape.dump()));
  const std::int64_t want[4] = {batch, heads, q_len, k_len};
  bool fits = true;
  for (std::size_t d = 0; d < 4; ++d) {
    const auto n = shape[d].is_number_unsigned() && shape[d].get<std::uint64_t>() > 0x7fffffffffffffffull
                       ? std::int64_t{-1}
                       : shape[d].get<std::int64_t>();
    fits = fits && (n == want[d] || (d < 2 && n == 1));
  }
  if (!fits)
    return error(ErrorCode::invalid_shape,
                 "the inspect document's shape " + printable(shape.dump()) + " is not the shape asked for, [" +
                     std::to_string(batch) + ", " + std::to_string(heads) + ", " + std::to_string(q_len) + ", " +
                     std::to_string(k_len) + "]: its structure (its ranges, documents and blocks) describes a mask " +
                     "of its own shape; ask for that shape (its batch and heads may be 1 for any), or pass a " +
                     "structure object alone");
  return {};
}

// tile_fractions holds exactly its three fields: a misspelt one would be dropped.
inline Status check_tile_fraction_keys(const nlohmann::json& t) {
  if (!t.is_object()) return {};
  for (const auto& [key, value] : t.items())
    if (key != "block" && key != "partial" && key != "full")
      return error(ErrorCode::parse_error, "structure.tile_fractions." + printable(key) +
                                               " is not a tile_fractions field (block, partial, full)");
  return {};
}

}  // namespace detail

// Reads a structure object (or a whole inspect document, taking its "structure") for a
// shape [B, H, Q, K]. A value of the wrong JSON type is a parse_error; the rest is
// MaskStructure::validate()'s (invalid_argument, or invalid_shape for the shape). The
// empty-row count of a structured kind is derived, so a count left out reads as the
// implied one and a wrong one is an error.
inline Result<MaskStructure> structure_from_json(const nlohmann::json& doc, std::int64_t batch, std::int64_t heads,
                                                 std::int64_t q_len, std::int64_t k_len) {
  return catch_alloc([&]() -> Result<MaskStructure> {
    const bool whole_document = doc.is_object() && doc.contains("structure");
    if (whole_document)
      if (Status s = detail::check_document(doc, batch, heads, q_len, k_len); !s.ok()) return s;
    const nlohmann::json& j = whole_document ? doc["structure"] : doc;
    if (!j.is_object()) return error(ErrorCode::parse_error, "structure must be a JSON object");
    MaskStructure s;
    s.batch = batch;
    s.heads = heads;
    s.q_len = q_len;
    s.k_len = k_len;
    if (!j.contains("kind") || !j["kind"].is_string()) return error(ErrorCode::parse_error, "structure.kind must be a string");
    const std::string kind = j["kind"].get<std::string>();
    bool found = false;
    for (StructureKind k : {StructureKind::full, StructureKind::causal, StructureKind::sliding_window, StructureKind::chunked,
                            StructureKind::prefix_lm, StructureKind::causal_blocks, StructureKind::arbitrary})
      if (kind == to_string(k)) s.kind = k, found = true;
    if (!found) return error(ErrorCode::parse_error, "structure.kind '" + detail::printable(kind) + "' is not a known kind");
    if (Status keys = detail::check_structure_keys(j, s.kind); !keys.ok()) return keys;
    for (const char* list : {"kv_valid", "q_valid", "segments"})
      if (j.contains(list))
        if (Status st = detail::non_empty_list(j[list], std::string("structure.") + list, batch); !st.ok()) return st;
    if (j.contains("alignment") && !j["alignment"].is_null()) {
      const auto a = j["alignment"].is_string() ? j["alignment"].get<std::string>() : std::string();
      if (a == "top_left") s.alignment = Alignment::top_left;
      else if (a == "bottom_right") s.alignment = Alignment::bottom_right;
      else return error(ErrorCode::parse_error, "structure.alignment must be top_left or bottom_right");
    }
    const std::pair<StructureKind, std::pair<const char*, std::int64_t*>> parameters[] = {
        {StructureKind::sliding_window, {"window", &s.window}},
        {StructureKind::chunked, {"chunk", &s.chunk}},
        {StructureKind::prefix_lm, {"prefix", &s.prefix}}};
    for (const auto& [owner, field] : parameters) {
      if (s.kind != owner) continue;
      auto v = detail::integer(j, field.first);
      if (!v) return v.status();
      *field.second = *v;
    }
    if (s.kind == StructureKind::causal_blocks) {
      if (!j.contains("blocks")) return error(ErrorCode::parse_error, "structure.blocks must be an array of [start, end]");
      auto blocks = detail::ranges_from_json(j["blocks"], "structure.blocks");
      if (!blocks) return blocks.status();
      s.blocks = std::move(*blocks);
    }
    if (j.contains("kv_valid") && !j["kv_valid"].is_null()) {
      auto kv = detail::ranges_from_json(j["kv_valid"], "structure.kv_valid");
      if (!kv) return kv.status();
      s.kv_valid = std::move(*kv);
    }
    if (j.contains("q_valid") && !j["q_valid"].is_null()) {
      auto rows = detail::ranges_from_json(j["q_valid"], "structure.q_valid");
      if (!rows) return rows.status();
      s.q_valid = std::move(*rows);
    }
    if (j.contains("segments") && !j["segments"].is_null()) {
      const auto& all = j["segments"];
      if (!all.is_array()) return error(ErrorCode::parse_error, "structure.segments must be an array of offset lists");
      for (std::size_t b = 0; b < all.size(); ++b) {
        const auto& seg = all[b];
        const std::string where = "structure.segments[" + std::to_string(b) + "]";
        if (!seg.is_array()) return error(ErrorCode::parse_error, where + " must be an array of integers");
        std::vector<std::int64_t> offsets;
        for (const auto& o : seg) {
          if (!o.is_number_integer()) return error(ErrorCode::parse_error, where + " must be an array of integers");
          auto offset = detail::int_from_json(o, where + "[" + std::to_string(offsets.size()) + "]");
          if (!offset) return offset.status();
          offsets.push_back(*offset);
        }
        s.segments.push_back(std::move(offsets));
      }
    }
    const auto count = [&](const char* key) -> Result<std::int64_t> {
      if (!j.contains(key) || j[key].is_null()) return std::int64_t{0};
      return detail::int_from_json(j[key], std::string("structure.") + key);
    };
    auto empty = count("empty_rows");
    if (!empty) return empty.status();
    s.empty_rows = *empty;
    auto finite = count("finite_masked_rows");
    if (!finite) return finite.status();
    s.finite_masked_rows = *finite;
    if (j.contains("bias") && !j["bias"].is_null()) {
      if (!j["bias"].is_boolean()) return error(ErrorCode::parse_error, "structure.bias must be true or false");
      s.bias = j["bias"].get<bool>();
    }
    if (j.contains("tile_fractions") && !j["tile_fractions"].is_null()) {
      const nlohmann::json& t = j["tile_fractions"];
      if (Status keys = detail::check_tile_fraction_keys(t); !keys.ok()) return keys;
      const bool well_typed = t.is_object() && t.contains("block") && t["block"].is_array() && t["block"].size() == 2 &&
                              t["block"][0].is_number_integer() && t["block"][1].is_number_integer() &&
                              t.contains("partial") && t["partial"].is_number() && t.contains("full") &&
                              t["full"].is_number();
      if (!well_typed)
        return error(ErrorCode::parse_error,
                     "structure.tile_fractions must be {\"block\": [q, k], \"partial\": share, \"full\": share}");
      auto block = detail::range_from_json(t["block"], "structure.tile_fractions.block");
      if (!block) return block.status();
      s.tile_fractions = TileFractions{block->start, block->end, t["partial"].get<double>(), t["full"].get<double>()};
    }
    if (Status invalid = s.validate(); !invalid.ok()) return invalid;
    s.empty_rows = s.implied_empty_rows();
    return s;
  });
}

}  // namespace masklens
