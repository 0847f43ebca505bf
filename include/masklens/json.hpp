// Optional JSON support (needs nlohmann-json; the core headers never include this):
// the CLI's --json contract, schema 2 (docs/json.md).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "call_args.hpp"
#include "policy.hpp"
#include "status.hpp"
#include "structure.hpp"

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
          return {{"type", "varlen"}, {"sequences", std::move(seqs)}, {"packed", a.packed}, {"causal", a.causal},
                  {"window_left", a.window_left}, {"window_right", a.window_right}};
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
  if (s.has_kv_valid()) {
    j["kv_valid"] = nlohmann::json::array();
    for (const KeyRange& r : s.kv_valid) j["kv_valid"].push_back({r.start, r.end});
  } else {
    j["kv_valid"] = nullptr;
  }
  j["empty_rows"] = s.empty_rows;
  j["finite_masked_rows"] = s.finite_masked_rows;
  j["bias"] = s.bias;
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

inline Result<KeyRange> range_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_array() || j.size() != 2 || !j[0].is_number_integer() || !j[1].is_number_integer())
    return error(ErrorCode::parse_error, where + " must be [start, end] with two integers");
  return KeyRange{j[0].get<std::int64_t>(), j[1].get<std::int64_t>()};
}

inline Result<std::int64_t> positive(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() < 1)
    return error(ErrorCode::parse_error, std::string("structure.") + key + " must be an integer >= 1");
  return j[key].get<std::int64_t>();
}

}  // namespace detail

// Reads a structure object (or a whole inspect document, taking its "structure") for a
// shape [B, H, Q, K], and checks that it is well formed for that shape.
inline Result<MaskStructure> structure_from_json(const nlohmann::json& doc, std::int64_t batch, std::int64_t heads,
                                                 std::int64_t q_len, std::int64_t k_len) {
  if (batch < 1 || heads < 1 || q_len < 1 || k_len < 1)
    return error(ErrorCode::invalid_shape, "shape must be four integers >= 1");
  const nlohmann::json& j = doc.is_object() && doc.contains("structure") ? doc["structure"] : doc;
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
  if (!found) return error(ErrorCode::parse_error, "structure.kind '" + kind + "' is not a known kind");
  if (j.contains("alignment") && !j["alignment"].is_null()) {
    const auto a = j["alignment"].is_string() ? j["alignment"].get<std::string>() : std::string();
    if (a == "top_left") s.alignment = Alignment::top_left;
    else if (a == "bottom_right") s.alignment = Alignment::bottom_right;
    else return error(ErrorCode::parse_error, "structure.alignment must be top_left or bottom_right");
  }
  if (s.kind == StructureKind::sliding_window) {
    auto w = detail::positive(j, "window");
    if (!w) return w.status();
    s.window = *w;
  }
  if (s.kind == StructureKind::chunked) {
    auto c = detail::positive(j, "chunk");
    if (!c) return c.status();
    s.chunk = *c;
  }
  if (s.kind == StructureKind::prefix_lm) {
    auto p = detail::positive(j, "prefix");
    if (!p) return p.status();
    s.prefix = *p;
  }
  if (s.kind == StructureKind::causal_blocks) {
    if (!j.contains("blocks") || !j["blocks"].is_array() || j["blocks"].empty())
      return error(ErrorCode::parse_error, "structure.blocks must be a non-empty array of [start, end]");
    std::int64_t prev_end = 0;
    for (std::size_t i = 0; i < j["blocks"].size(); ++i) {
      auto r = detail::range_from_json(j["blocks"][i], "structure.blocks[" + std::to_string(i) + "]");
      if (!r) return r.status();
      if (r->start < prev_end || r->end <= r->start || r->end > k_len)
        return error(ErrorCode::parse_error, "structure.blocks must be sorted, disjoint, non-empty and inside [0, K)");
      prev_end = r->end;
      s.blocks.push_back(*r);
    }
  }
  if (j.contains("kv_valid") && !j["kv_valid"].is_null()) {
    if (!j["kv_valid"].is_array() || static_cast<std::int64_t>(j["kv_valid"].size()) != batch)
      return error(ErrorCode::parse_error, "structure.kv_valid must list one [start, end] per batch (" + std::to_string(batch) + ")");
    for (std::size_t i = 0; i < j["kv_valid"].size(); ++i) {
      auto r = detail::range_from_json(j["kv_valid"][i], "structure.kv_valid[" + std::to_string(i) + "]");
      if (!r) return r.status();
      if (r->start < 0 || r->end < r->start || r->end > k_len)
        return error(ErrorCode::parse_error, "structure.kv_valid[" + std::to_string(i) + "] must satisfy 0 <= start <= end <= K");
      s.kv_valid.push_back(*r);
    }
  }
  if (j.contains("segments") && !j["segments"].is_null()) {
    if (q_len != k_len) return error(ErrorCode::parse_error, "structure.segments need Q == K");
    if (!j["segments"].is_array() || static_cast<std::int64_t>(j["segments"].size()) != batch)
      return error(ErrorCode::parse_error, "structure.segments must list one offset list per batch (" + std::to_string(batch) + ")");
    for (std::size_t b = 0; b < j["segments"].size(); ++b) {
      const auto& seg = j["segments"][b];
      std::vector<std::int64_t> offsets;
      bool ok = seg.is_array() && seg.size() >= 2;
      for (std::size_t i = 0; ok && i < seg.size(); ++i) {
        ok = seg[i].is_number_integer() && (i == 0 || seg[i].get<std::int64_t>() > offsets.back());
        if (ok) offsets.push_back(seg[i].get<std::int64_t>());
      }
      if (!ok || offsets.front() != 0 || offsets.back() != q_len)
        return error(ErrorCode::parse_error, "structure.segments[" + std::to_string(b) +
                                                 "] must rise strictly from 0 to Q (" + std::to_string(q_len) + ")");
      s.segments.push_back(std::move(offsets));
    }
  }
  const auto count = [&](const char* key) -> Result<std::int64_t> {
    if (!j.contains(key) || j[key].is_null()) return std::int64_t{0};
    if (!j[key].is_number_integer() || j[key].get<std::int64_t>() < 0)
      return error(ErrorCode::parse_error, std::string("structure.") + key + " must be an integer >= 0");
    return j[key].get<std::int64_t>();
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
  return s;
}

}  // namespace masklens
