// masklens._core: the typed structure and policy for Python. Masks cross as DLPack
// arrays (torch tensors, numpy arrays) without a copy; structures, calls and policies
// cross as classes whose fields are the C++ fields, so Python drives a call from
// values, never from JSON or source text. Enumerations cross as the names the JSON
// contract uses (docs/json.md), so `policy.call.backend == "torch.sdpa.cudnn"`.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <masklens/call_args.hpp>
#include <masklens/classify_runs.hpp>
#include <masklens/describe.hpp>
#include <masklens/json.hpp>
#include <masklens/masklens.hpp>
#include <masklens/verdict.hpp>

#include "definition_binding.hpp"
#include "device_runs.hpp"
#include "device_view.hpp"
#include "status_error.hpp"

#include <array>
#include <optional>
#include <cstring>
#include <memory>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace nb = nanobind;
using namespace nb::literals;
using namespace masklens;
using masklens::python::raise;
using masklens::python::StatusError;
using masklens::python::take;

namespace {

// Names <-> enumerations, through the to_string() every enumeration has.
template <class E, std::size_t N>
E from_name(const std::string& name, const std::array<E, N>& all, const char* what) {
  std::string known;
  for (E e : all) {
    if (to_string(e) == name) return e;
    known += (known.empty() ? "" : ", ") + std::string(to_string(e));
  }
  raise(error(ErrorCode::invalid_argument, std::string(what) + " '" + name + "' is not one of: " + known));
}

constexpr std::array kKinds{StructureKind::full,      StructureKind::causal,        StructureKind::sliding_window,
                            StructureKind::chunked,   StructureKind::prefix_lm,     StructureKind::causal_blocks,
                            StructureKind::arbitrary};
constexpr std::array kAlignments{Alignment::top_left, Alignment::bottom_right};
constexpr std::array kElements{ElementType::boolean, ElementType::uint8,    ElementType::int8,
                               ElementType::float16, ElementType::bfloat16, ElementType::float32};
constexpr std::array kDTypes{DType::float16, DType::bfloat16, DType::float32};

DType dtype_named(const std::string& name) {
  if (name == "bfloat16") return DType::bfloat16;
  if (name == "float16") return DType::float16;
  if (name == "float32") return DType::float32;
  return from_name(name, kDTypes, "dtype");
}

// The element type of a DLPack array, or unsupported_dtype naming it.
ElementType element_of(nb::dlpack::dtype d) {
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(d.code);
  if (d.lanes == 1) {
    if (code == C::Bool && d.bits == 8) return ElementType::boolean;
    if (code == C::UInt && d.bits == 8) return ElementType::uint8;
    if (code == C::Int && d.bits == 8) return ElementType::int8;
    if (code == C::Float && d.bits == 16) return ElementType::float16;
    if (code == C::Bfloat && d.bits == 16) return ElementType::bfloat16;
    if (code == C::Float && d.bits == 32) return ElementType::float32;
  }
  static constexpr const char* kCodes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string name = d.code < std::size(kCodes) ? kCodes[d.code] : "code " + std::to_string(d.code);
  raise(error(ErrorCode::unsupported_dtype, "mask dtype " + name + std::to_string(d.bits) +
                                                " is not a mask type (bool, uint8, int8, float16, bfloat16, float32)"));
}

using Range = std::pair<std::int64_t, std::int64_t>;
Range pair_of(const KeyRange& r) { return {r.start, r.end}; }
KeyRange range_of(const Range& r) { return {r.first, r.second}; }

std::vector<Range> pairs_of(const std::vector<KeyRange>& ranges) {
  std::vector<Range> out;
  out.reserve(ranges.size());
  for (const KeyRange& r : ranges) out.push_back(pair_of(r));
  return out;
}
std::vector<KeyRange> ranges_of(const std::vector<Range>& pairs) {
  std::vector<KeyRange> out;
  out.reserve(pairs.size());
  for (const Range& r : pairs) out.push_back(range_of(r));
  return out;
}

// A per-batch range modifier (kv_valid, q_valid) as a Python property: None when absent.
template <std::vector<KeyRange> MaskStructure::*kField>
std::optional<std::vector<Range>> get_modifier(const MaskStructure& s) {
  if ((s.*kField).empty()) return std::nullopt;
  return pairs_of(s.*kField);
}
template <std::vector<KeyRange> MaskStructure::*kField>
void set_modifier(MaskStructure& s, const std::optional<std::vector<Range>>& v) {
  s.*kField = v ? ranges_of(*v) : std::vector<KeyRange>{};
}

// The library's argument values as Python values: int pairs and index tensors as lists
// (the JSON contract's spelling; the runner makes tensors of them on the right device).
nb::object py_value(const ArgValue& v) {
  return std::visit(
      [](const auto& x) -> nb::object {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, IntPair>) {
          nb::list l;
          l.append(x.first);
          l.append(x.second);
          return l;
        } else if constexpr (std::is_same_v<T, IndexTensor>) {
          return nb::cast(x.values);
        } else if constexpr (std::is_same_v<T, Identifier>) {
          return nb::str(x.text.data(), x.text.size());
        } else if constexpr (std::is_same_v<T, std::string_view>) {
          return nb::str(x.data(), x.size());
        } else {
          return nb::cast(x);
        }
      },
      v);
}

nb::dict py_args(const std::vector<NamedArg>& args) {
  nb::dict d;
  for (const NamedArg& a : args) d[nb::str(a.name.data(), a.name.size())] = py_value(a.value);
  return d;
}

// Verdict, attends() and verdict_of() are the library's (verdict.hpp); a run's Verdict
// is classified with the GIL released, and its error raised once it is held again.
Verdict verdict_unlocked(SpanRuns runs) {
  Result<Verdict> v = [&] {
    nb::gil_scoped_release unlocked;
    return verdict_of(std::move(runs));
  }();
  return take(std::move(v));
}

using masklens::python::DeviceRuns;

// A host mask (DLPack array) as a MaskView: its element type, 1 to 4 dims, strides in
// elements (0 broadcasts).
MaskView host_view(const nb::ndarray<nb::ro, nb::device::cpu>& mask, float masked_threshold) {
  const ElementType type = element_of(mask.dtype());
  if (mask.ndim() < 1 || mask.ndim() > 4)
    raise(error(ErrorCode::invalid_shape, "mask must have 1 to 4 dims, got " + std::to_string(mask.ndim())));
  std::array<std::int64_t, 4> shape{}, strides{};
  for (std::size_t i = 0; i < mask.ndim(); ++i) {
    shape[i] = static_cast<std::int64_t>(mask.shape(i));
    strides[i] = mask.stride(i);
  }
  MaskEncoding enc;
  enc.masked_threshold = masked_threshold;
  return take(MaskView::make(mask.data(), type, std::span<const std::int64_t>(shape.data(), mask.ndim()),
                             std::span<const std::int64_t>(strides.data(), mask.ndim()), enc));
}

TileSize tile_size(std::int64_t block_q, std::int64_t block_k) {
  if (block_q < 1 || block_k < 1)
    raise(error(ErrorCode::invalid_argument, "tile size must be two integers >= 1, got " + std::to_string(block_q) +
                                                 " x " + std::to_string(block_k)));
  return TileSize{block_q, block_k};
}

// One of BlockMask's tensors as a numpy int32 array over the C++ vector, no copy: the
// array keeps the BlockMaskTensors object (`self`) alive. Writable, so torch.from_numpy
// shares it as it is (it warns on read-only arrays); the object is the caller's.
nb::ndarray<nb::numpy, std::int32_t> field_array(nb::pointer_and_handle<BlockMaskTensors> self, BlockMaskField f) {
  const Int32Tensor x = self.p->tensor(f);
  std::size_t shape[4];
  for (int d = 0; d < x.rank; ++d) shape[d] = static_cast<std::size_t>(x.shape[static_cast<std::size_t>(d)]);
  return nb::ndarray<nb::numpy, std::int32_t>(const_cast<std::int32_t*>(x.data), static_cast<std::size_t>(x.rank),
                                              shape, self.h);
}

// The same, one field fixed: a property's getter.
template <BlockMaskField kField>
nb::ndarray<nb::numpy, std::int32_t> tensor_array(nb::pointer_and_handle<BlockMaskTensors> self) {
  return field_array(self, kField);
}

std::optional<std::string> version_text(const Version& v) {
  return v.known() ? std::optional<std::string>(v.to_string()) : std::nullopt;
}
Version parse_version(const std::optional<std::string>& text, const char* field) {
  if (!text) return Version{};
  Result<Version> v = Version::parse(*text);
  if (!v) raise(error(ErrorCode::invalid_argument, std::string("environment.") + field + ": " + v.status().message()));
  return *v;
}

// A version field of Environment as an optional string property ("2.11", None = not installed).
void version_property(nb::class_<Environment>& c, const char* name, Version Environment::*field) {
  c.def_prop_rw(
      name, [field](const Environment& e) { return version_text(e.*field); },
      [name, field](Environment& e, const std::optional<std::string>& v) { e.*field = parse_version(v, name); },
      nb::arg("value").none());
}

// The rule's mask_mod as masklens.torch compiles it (_mask_mods.mask_mod_for): its
// tables are tensors bound by name, clamps read the tables' sizes and the bottom-right
// offset and a prefix-LM's prefix are 0-d tensors, so a compiled flex of dynamic lengths
// serves every length, offset and prefix of its bucket; the window and chunk, a model's
// constants, are written in; a table given once for every batch is read at batch 0.
std::pair<std::string, std::vector<std::string>> mask_mod_source(const MaskStructure& s) {
  PythonOperands o;
  o.key_last = o.block_last = "block_id.shape[0] - 1";
  o.document_last = "document_id.shape[1] - 1";
  const auto batch = [](std::size_t entries) { return entries > 1 ? "b" : "0"; };
  o.document_batch = batch(s.segments.size()), o.kv_batch = batch(s.kv_valid.size()), o.q_batch = batch(s.q_valid.size());
  std::string source = "def mask_mod(b, h, q_idx, kv_idx):\n";
  std::vector<std::string> tables;
  // The prefix changes with each prompt (a prefix-LM's or a VLM's prefix): a 0-d tensor, as
  // the offset, so one source (one code object, one compiled flex) serves every prefix.
  if (has_term(mask_rule(s), RuleTerm::key_in_prefix)) o.prefix = "prefix", tables.emplace_back("prefix");
  if (rule_offset(s) != 0) {
    o.p = "p";
    source += "    p = q_idx + offset\n";
    tables.emplace_back("offset");
  }
  for (std::string_view t : python_tables(s)) tables.emplace_back(t);
  return {source + "    return " + python_rule(s, o) + "\n", tables};
}

// MaskStructure, its one-line description and its rule's mask_mod (structure.hpp,
// describe.hpp, mask_rule.hpp).
void bind_structure(nb::module_& m) {
  nb::class_<MaskStructure>(m, "MaskStructure", "The canonical description of a mask (docs/structures.md).")
      .def(nb::init<>())
      .def_rw("batch", &MaskStructure::batch)
      .def_rw("heads", &MaskStructure::heads)
      .def_rw("q_len", &MaskStructure::q_len)
      .def_rw("k_len", &MaskStructure::k_len)
      .def_prop_rw(
          "kind", [](const MaskStructure& s) { return std::string(to_string(s.kind)); },
          [](MaskStructure& s, const std::string& v) { s.kind = from_name(v, kKinds, "structure.kind"); })
      .def_prop_rw(
          "alignment", [](const MaskStructure& s) { return std::string(to_string(s.alignment)); },
          [](MaskStructure& s, const std::string& v) { s.alignment = from_name(v, kAlignments, "structure.alignment"); })
      .def_rw("window", &MaskStructure::window)
      .def_rw("chunk", &MaskStructure::chunk)
      .def_rw("prefix", &MaskStructure::prefix)
      .def_prop_rw(
          "blocks",
          [](const MaskStructure& s) { return pairs_of(s.blocks); },
          [](MaskStructure& s, const std::vector<Range>& v) { s.blocks = ranges_of(v); })
      .def_prop_rw(
          "segments",
          [](const MaskStructure& s) {
            return s.has_segments() ? std::optional(s.segments) : std::nullopt;
          },
          [](MaskStructure& s, const std::optional<std::vector<std::vector<std::int64_t>>>& v) {
            s.segments = v ? *v : std::vector<std::vector<std::int64_t>>{};
          },
          nb::arg("value").none(), "Per batch document offsets [0, e1, ..., Q], or None.")
      .def_prop_rw("kv_valid", get_modifier<&MaskStructure::kv_valid>, set_modifier<&MaskStructure::kv_valid>,
                   nb::arg("value").none(), "Per batch valid keys (start, end), or None.")
      .def_prop_rw("q_valid", get_modifier<&MaskStructure::q_valid>, set_modifier<&MaskStructure::q_valid>,
                   nb::arg("value").none(),
                   "Per batch valid query rows (start, end), or None: the others attend nothing.")
      .def_rw("tile_fractions", &MaskStructure::tile_fractions, nb::arg("value").none(),
              "An arbitrary mask's shares of partial and full tiles (TileFractions), where its tiles were counted "
              "(inspect(tiles=...)); None otherwise.")
      .def_rw("empty_rows", &MaskStructure::empty_rows)
      .def_rw("finite_masked_rows", &MaskStructure::finite_masked_rows)
      .def_rw("bias", &MaskStructure::bias)
      .def("key_position", &MaskStructure::key_position, "q"_a)
      .def(
          "row",
          [](const MaskStructure& s, std::int64_t b, std::int64_t q) -> std::optional<Range> {
            if (s.kind == StructureKind::arbitrary) raise(error(ErrorCode::invalid_argument, "an arbitrary structure has no rows"));
            if (Status invalid = s.validate(); !invalid.ok()) raise(invalid);  // row() trusts a valid structure
            if (b < 0 || b >= s.batch || q < 0 || q >= s.q_len)
              raise(error(ErrorCode::invalid_argument, "row (" + std::to_string(b) + ", " + std::to_string(q) +
                                                           ") is outside the structure"));
            const RowSpan r = s.row(b, q);
            return r.empty() ? std::nullopt : std::optional<Range>(Range{r.first, r.last + 1});
          },
          "b"_a, "q"_a, "Keys [start, end) row q of batch b attends, or None.")
      .def("describe", [](const MaskStructure& s) { return describe(s); })
      .def("__repr__", [](const MaskStructure& s) {
        return "<MaskStructure [" + std::to_string(s.batch) + ", " + std::to_string(s.heads) + ", " +
               std::to_string(s.q_len) + ", " + std::to_string(s.k_len) + "] " + describe(s) + ">";
      });

  m.def("describe", [](const MaskStructure& s) { return describe(s); });
  m.def(
      "mask_mod_source",
      [](const MaskStructure& s, bool printed) {
        if (Status invalid = s.validate(); !invalid.ok()) raise(invalid);
        if (!printed) return mask_mod_source(s);
        // The CLI's text: the tables built first, every number written in.
        return std::pair{backends::flex_attention::python_mask_mod(take(spell_out(s)), Call{}, std::nullopt),
                         std::vector<std::string>{}};
      },
      "structure"_a, "printed"_a = false,
      "FlexAttention's mask_mod of the structure's rule (mask_rule.hpp) as Python source, and the tables it "
      "reads by name (offset, prefix, block_id, document_id, kv_start, kv_end, q_start, q_end), as "
      "masklens.torch compiles it. printed=True: the text the masklens command prints instead, which builds "
      "its tables itself on q.device (names: an empty list).");
  m.def(
      "block_table_length", [](const MaskStructure& s) { return block_table_length(s); }, "structure"_a,
      "The length of the mask_mod's block_id table (mask_rule.hpp): every key and every row's key position.");
}

// The host scan and the host half of a device scan: Verdict, scan(), DeviceRuns.
void bind_scan(nb::module_& m) {
  nb::class_<Verdict>(m, "Verdict", "A scanned mask: its structure and which rows attend to any key.")
      .def_ro("structure", &Verdict::structure)
      .def(
          "attending_rows",
          [](const Verdict& v) {
            // [distinct batch, distinct heads, Q]: broadcasts against [B, H, Q] as the mask did.
            const auto n = static_cast<std::size_t>(v.rows());
            auto* rows = new std::uint8_t[n];
            attending_rows(v, std::span<std::uint8_t>(rows, n));
            nb::capsule owner(rows, [](void* p) noexcept { delete[] static_cast<std::uint8_t*>(p); });
            const std::size_t shape[3] = {static_cast<std::size_t>(v.distinct_batch()),
                                          static_cast<std::size_t>(v.distinct_heads()),
                                          static_cast<std::size_t>(v.q_len())};
            return nb::ndarray<nb::numpy, bool, nb::ndim<3>>(reinterpret_cast<bool*>(rows), 3, shape, owner);
          },
          "Whether each row attends to any key (or is masked only by finite values): bool [distinct batch, "
          "distinct heads, Q].")
      .def_prop_ro(
          "run_count",
          [](const Verdict& v) {
            return v.runs ? std::optional<std::int64_t>(static_cast<std::int64_t>(v.runs->runs.size())) : std::nullopt;
          },
          "Runs of rows a device scan brought to the host (span_runs.hpp); None for a host scan's span table.")
      .def_prop_ro(
          "runs",
          [](const Verdict& v) {
            std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                   std::int64_t, std::uint32_t>>
                out;
            if (v.runs)
              for (const SpanRun& r : v.runs->runs)
                out.emplace_back(r.row, r.length, r.first, r.last, r.d_first, r.d_last, r.count, r.flags);
            return out;
          },
          "A device scan's runs as (row, length, first, last, d_first, d_last, count, flags); [] for a host scan.");

  m.def(
      "scan",
      [](nb::ndarray<nb::ro, nb::device::cpu> mask, float masked_threshold, int threads) {
        const MaskView view = host_view(mask, masked_threshold);
        Result<Verdict> v = [&] {
          nb::gil_scoped_release unlocked;
          return scan_verdict(view, scan_options_for(view, threads));
        }();
        return take(std::move(v));
      },
      "mask"_a, "masked_threshold"_a = -1000.0f, "threads"_a = 0,
      "Scan a host mask (a DLPack array: a torch CPU tensor or a numpy array; strides in elements, 0 broadcasts) "
      "and classify it. Raises MaskError naming the first bad element or field.");


  // Made by masklens._cuda.plan_runs (the library's size query); the constructor, from
  // the temporary sizes, serves a stand-in for the device (tests/python/test_cuda_module.py).
  nb::class_<DeviceRuns>(m, "DeviceRuns",
                         "The host half of a device scan: the view planned, the device block's layout "
                         "(include/masklens/cuda/runs_block.hpp), host memory the run count and runs cross into, "
                         "and finish() to classify them. masklens._cuda.plan_runs makes one.")
      .def(
          "__init__",
          [](DeviceRuns* self, std::uintptr_t data, const std::string& dtype, const std::vector<std::int64_t>& shape,
             const std::vector<std::int64_t>& strides, float masked_threshold, std::size_t scan_temp_bytes,
             std::size_t reduce_temp_bytes, std::int64_t block_q, std::int64_t block_k) {
            const MaskView view = take(python::view_of(data, dtype, shape, strides, masked_threshold));
            const gpu::RunsBlock block =
                gpu::runs_block_layout(gpu::span_rows(view), view.q_len(), scan_temp_bytes, reduce_temp_bytes);
            std::optional<TileSize> tiles;
            if (block_q != 0 || block_k != 0) tiles = tile_size(block_q, block_k);
            new (self) DeviceRuns(take(python::device_runs(view, block, tiles)));
          },
          "data"_a, "dtype"_a, "shape"_a, "strides"_a, "masked_threshold"_a, "scan_temp_bytes"_a, "reduce_temp_bytes"_a,
          "block_q"_a = 0, "block_k"_a = 0)
      .def_prop_ro("block_bytes", [](const DeviceRuns& d) { return d.block.bytes; })
      .def_prop_ro(
          "layout",
          [](const DeviceRuns& d) {
            nb::dict l;
            l["count"] = d.block.count_at;
            l["first_invalid"] = d.block.first_invalid_at;
            l["runs"] = d.block.runs_at;
            l["spans"] = d.block.spans_at;
            l["scan_temp"] = d.block.scan_temp_at;
            l["reduce_temp"] = d.block.reduce_temp_at;
            l["bytes"] = d.block.bytes;
            return l;
          },
          "Byte offsets of the block's parts: count, first_invalid (the first row holding NaN / +inf, -1: none), runs "
          "(room of them), spans (one per row), scan and reduce temps.")
      .def_prop_ro("rows", [](const DeviceRuns& d) { return d.block.rows; })
      .def_prop_ro(
          "tile_grid",
          [](const DeviceRuns& d) -> std::optional<std::vector<std::int64_t>> {
            if (!d.tiles) return std::nullopt;
            const TileGrid g = take(tile_grid_for(d.view, *d.tiles));
            return std::vector<std::int64_t>{g.distinct_batch, g.distinct_heads, g.q_tiles(), g.k_tiles()};
          },
          "[distinct batch, distinct heads, q tiles, k tiles] of a tile scan's BlockMask arrays (None for a scan "
          "without tiles).")
      .def(
          "check_rows",
          [](const DeviceRuns& d) {
            const gpu::RunsHead h = take(d.read_head());
            if (h.first_invalid_row >= 0) raise(masklens::detail::invalid_row_error(d.shape, h.first_invalid_row));
          },
          "Raises finish()'s MaskError where the run reduction found a row holding NaN or +inf (the first such "
          "row, in the head that came back with the count), without classifying the runs: a caller that needs no "
          "verdict still rejects such a mask.")
      .def_prop_ro("room", [](const DeviceRuns& d) { return d.block.room; }, "Runs the block holds.")
      .def_prop_ro("eager", [](const DeviceRuns& d) { return d.block.eager; }, "Runs that come back with the count.")
      .def_prop_ro("head_address", [](const DeviceRuns& d) { return reinterpret_cast<std::uintptr_t>(d.head.get()); })
      .def_prop_ro("head_bytes", [](const DeviceRuns& d) { return d.block.head_bytes(); })
      .def(
          "rest_buffer",
          [](DeviceRuns& d, std::int64_t count) {
            if (Status st = python::hold_rest(d, count); !st.ok()) raise(st);
            return std::make_pair(reinterpret_cast<std::uintptr_t>(d.rest.data()), d.rest.size() * sizeof(SpanRun));
          },
          "count"_a, "(address, bytes) of host memory for runs [eager, count).")
      .def(
          "finish",
          [](DeviceRuns& d) {
            // the mask is on the device: a NaN row is named, not an element
            return verdict_unlocked(take(python::finish_runs(d)));
          },
          "The Verdict of the runs now in host memory, classified in O(runs) (MaskError naming a NaN / +inf row).");

}

// Tiles (tiles.hpp, docs/tiles.md): fractions, summaries, torch BlockMask's tensors.
void bind_tiles(nb::module_& m) {
  nb::class_<TileFractions>(m, "TileFractions",
                            "Shares of a mask's block_q x block_k tiles that are partial and full (the rest empty).")
      .def(nb::init<>())
      .def_rw("block_q", &TileFractions::block_q)
      .def_rw("block_k", &TileFractions::block_k)
      .def_rw("partial", &TileFractions::partial)
      .def_rw("full", &TileFractions::full)
      .def("__repr__", [](const TileFractions& t) {
        return "<TileFractions " + std::to_string(t.block_q) + "x" + std::to_string(t.block_k) +
               " partial=" + std::to_string(t.partial) + " full=" + std::to_string(t.full) + ">";
      });

  nb::class_<BlockMaskTensors>(m, "BlockMaskTensors",
                               "torch BlockMask's eight int32 tensors of a tile summary (numpy arrays over masklens' "
                               "memory, no copy): the kv side from_kv_blocks takes, and the q side it would derive.")
      .def_prop_ro("block_size",
                   [](const BlockMaskTensors& t) { return std::make_pair(t.grid.block_q, t.grid.block_k); })
      .def_prop_ro("seq_lengths", [](const BlockMaskTensors& t) { return std::make_pair(t.grid.q_len, t.grid.k_len); })
      .def_prop_ro("kv_num_blocks", &tensor_array<BlockMaskField::kv_num_blocks>)
      .def_prop_ro("kv_indices", &tensor_array<BlockMaskField::kv_indices>)
      .def_prop_ro("full_kv_num_blocks", &tensor_array<BlockMaskField::full_kv_num_blocks>)
      .def_prop_ro("full_kv_indices", &tensor_array<BlockMaskField::full_kv_indices>)
      .def_prop_ro("q_num_blocks", &tensor_array<BlockMaskField::q_num_blocks>)
      .def_prop_ro("q_indices", &tensor_array<BlockMaskField::q_indices>)
      .def_prop_ro("full_q_num_blocks", &tensor_array<BlockMaskField::full_q_num_blocks>)
      .def_prop_ro("full_q_indices", &tensor_array<BlockMaskField::full_q_indices>)
      .def(
          "cute",
          [](nb::pointer_and_handle<BlockMaskTensors> self, const std::string& side) {
            if (side != "kv" && side != "q")
              raise(error(ErrorCode::invalid_argument,
                          "side must be 'kv' (the forward's tensors) or 'q' (the backward's), got '" +
                              side + "'"));
            nb::dict out;
            for (const BlockMaskField f : kBlockMaskFields)
              if (is_kv_side(f) == (side == "kv")) {
                const std::string_view name = cute_name(f);
                out[nb::str(name.data(), name.size())] = field_array(self, f);
              }
            return out;
          },
          "side"_a = "kv",
          "The four tensors of one side under flash-attn's CuTe names (BlockSparseTensorsTorch: mask_block_cnt, "
          "mask_block_idx, full_block_cnt, full_block_idx): side 'kv' for its forward, 'q' for its backward.")
      .def_prop_ro_static("fields", [](nb::handle) {
        std::vector<std::string> out;
        for (BlockMaskField f : kBlockMaskFields) out.emplace_back(to_string(f));
        return out;
      }, "The eight tensors' names, torch's (BlockMask attributes, from_kv_blocks keywords).");

  nb::class_<TileSummary>(m, "TileSummary",
                          "Which tiles of a mask are empty, partial or full: [distinct batch, distinct heads, q tiles, "
                          "k tiles] (a stride-0 batch or head dimension summarised once).")
      .def_prop_ro("batch", [](const TileSummary& t) { return t.grid.batch; })
      .def_prop_ro("heads", [](const TileSummary& t) { return t.grid.heads; })
      .def_prop_ro("q_len", [](const TileSummary& t) { return t.grid.q_len; })
      .def_prop_ro("k_len", [](const TileSummary& t) { return t.grid.k_len; })
      .def_prop_ro("block_size", [](const TileSummary& t) { return std::make_pair(t.grid.block_q, t.grid.block_k); })
      .def_prop_ro("shape",
                   [](const TileSummary& t) {
                     return std::make_tuple(t.grid.distinct_batch, t.grid.distinct_heads, t.grid.q_tiles(),
                                            t.grid.k_tiles());
                   })
      .def_prop_ro("counts",
                   [](const TileSummary& t) {
                     const TileTally c = t.tally();
                     nb::dict d;
                     d["empty"] = c.empty;
                     d["partial"] = c.partial;
                     d["full"] = c.full;
                     return d;
                   },
                   "Tiles of each state over the stored slices.")
      .def("fractions", &TileSummary::fractions, "The shares decide() charges flex on (TileFractions).")
      .def_prop_ro(
          "states",
          [](nb::pointer_and_handle<TileSummary> self) {
            const TileGrid& g = self.p->grid;
            const std::size_t shape[4] = {static_cast<std::size_t>(g.distinct_batch),
                                          static_cast<std::size_t>(g.distinct_heads),
                                          static_cast<std::size_t>(g.q_tiles()), static_cast<std::size_t>(g.k_tiles())};
            return nb::ndarray<nb::numpy, const std::uint8_t>(
                reinterpret_cast<const std::uint8_t*>(self.p->states.data()), 4, shape, self.h);
          },
          "uint8 [B', H', q_tiles, k_tiles]: 0 empty, 1 partial, 2 full (no copy).")
      .def(
          "block_mask",
          [](const TileSummary& t) {
            Result<BlockMaskTensors> r{error(ErrorCode::invalid_argument, "")};
            {
              nb::gil_scoped_release unlocked;
              r = block_mask_tensors(t);
            }
            return take(std::move(r));
          },
          "torch BlockMask's eight tensors, entry for entry what create_block_mask builds for the same mask.");

  m.def(
      "tile_summary_from_states",
      [](nb::ndarray<const std::uint8_t, nb::ndim<4>, nb::c_contig, nb::device::cpu> states, std::int64_t batch,
         std::int64_t heads, std::int64_t q_len, std::int64_t k_len, std::int64_t block_q, std::int64_t block_k) {
        const TileGrid g = take(make_tile_grid(batch, heads, q_len, k_len, tile_size(block_q, block_k),
                                               static_cast<std::int64_t>(states.shape(0)),
                                               static_cast<std::int64_t>(states.shape(1))));
        if (static_cast<std::int64_t>(states.shape(2)) != g.q_tiles() ||
            static_cast<std::int64_t>(states.shape(3)) != g.k_tiles())
          raise(error(ErrorCode::invalid_argument,
                      "states are [" + std::to_string(states.shape(0)) + ", " + std::to_string(states.shape(1)) + ", " +
                          std::to_string(states.shape(2)) + ", " + std::to_string(states.shape(3)) +
                          "]; the grid has " + std::to_string(g.q_tiles()) + " x " + std::to_string(g.k_tiles()) +
                          " tiles a slice"));
        return take(tile_summary_from_states(g, states.data(), states.size()));
      },
      "states"_a, "batch"_a, "heads"_a, "q_len"_a, "k_len"_a, "block_q"_a, "block_k"_a,
      "A TileSummary over uint8 states [B', H', q tiles, k tiles] (0 empty, 1 partial, 2 full; B' and H' 1 or the "
      "batch and heads), e.g. a device summary copied back; each state checked (MaskError naming a bad tile).");

  m.def(
      "tiles_from_structure",
      [](const MaskStructure& s, std::int64_t block_q, std::int64_t block_k) {
        const TileSize size = tile_size(block_q, block_k);
        Result<TileSummary> r{error(ErrorCode::invalid_argument, "")};
        {
          nb::gil_scoped_release unlocked;
          r = tiles_from_structure(s, size);
        }
        return take(std::move(r));
      },
      "structure"_a, "block_q"_a = 128, "block_k"_a = 128,
      "An exact structure's tiles from its fields (no mask is read); equal, tile for tile, to scanning any mask it "
      "describes. MaskError for an arbitrary structure.");

  m.def(
      "structure_tile_ranges",
      [](const MaskStructure& s, std::int64_t block_q, std::int64_t block_k) {
        const TileSize size = tile_size(block_q, block_k);
        auto* ranges = new StructureTileRanges{take(structure_tile_ranges(s, size))};
        static_assert(sizeof(TileRowRanges) == 4 * sizeof(std::int64_t), "four int64 a q tile, as the array says");
        const TileGrid& g = ranges->grid;
        nb::capsule owner(ranges, [](void* p) noexcept { delete static_cast<StructureTileRanges*>(p); });
        const std::size_t shape[2] = {ranges->rows.size(), 4};
        nb::ndarray<nb::numpy, const std::int64_t, nb::ndim<2>> rows(
            reinterpret_cast<const std::int64_t*>(ranges->rows.data()), 2, shape, owner);
        return nb::make_tuple(
            std::vector<std::int64_t>{g.batch, g.heads, g.q_len, g.k_len, g.block_q, g.block_k, g.distinct_batch,
                                      g.distinct_heads},
            rows);
      },
      "structure"_a, "block_q"_a = 128, "block_k"_a = 128,
      "An exact structure's tiles as ranges: (grid [batch, heads, q_len, k_len, block_q, block_k, distinct_batch, "
      "distinct_heads], int64 [distinct slices x q tiles, 4]: per q tile the k tiles it touches [begin, end) and the "
      "ones it fills [begin, end)), the tiles tiles_from_structure() fills in. MaskError for an arbitrary structure.");

  m.def(
      "scan_with_tiles",
      [](nb::ndarray<nb::ro, nb::device::cpu> mask, std::int64_t block_q, std::int64_t block_k, float masked_threshold,
         int threads) {
        const MaskView view = host_view(mask, masked_threshold);
        const TileSize size = tile_size(block_q, block_k);
        Result<SpansAndTiles> both = [&] {
          nb::gil_scoped_release unlocked;
          return scan_with_tiles(view, size, scan_options_for(view, threads));
        }();
        if (!both) raise(both.status());
        TileSummary tiles = std::move(both->tiles);
        Result<Verdict> made = [&] {
          nb::gil_scoped_release unlocked;
          return verdict_of(std::move(both->spans));
        }();
        Verdict v = take(std::move(made));
        // An arbitrary mask is charged for flex on its tiles (an exact structure's follow
        // from its fields), as the CLI's inspect --tiles does.
        if (v.structure.kind == StructureKind::arbitrary) v.structure.tile_fractions = tiles.fractions();
        return std::make_pair(std::move(v), std::move(tiles));
      },
      "mask"_a, "block_q"_a = 128, "block_k"_a = 128, "masked_threshold"_a = -1000.0f, "threads"_a = 0,
      "Scan a host mask and count its tiles in the same read: (Verdict, TileSummary). An arbitrary verdict's "
      "structure carries the tiles' fractions.");

}

// The call and where it runs (call.hpp): AttentionCall, and Environment with a version
// property per family that has one (kFamilies).
void bind_call_and_environment(nb::module_& m) {
  nb::class_<AttentionCall>(m, "AttentionCall", "The attention call at hand (include/masklens/call.hpp).")
      .def(nb::init<>())
      .def_prop_rw(
          "dtype", [](const AttentionCall& c) { return std::string(to_string(c.dtype)); },
          [](AttentionCall& c, const std::string& v) { c.dtype = dtype_named(v); })
      .def_rw("head_dim", &AttentionCall::head_dim)
      .def_rw("head_dim_v", &AttentionCall::head_dim_v)
      .def_rw("batch", &AttentionCall::batch)
      .def_rw("heads", &AttentionCall::heads)
      .def_rw("kv_heads", &AttentionCall::kv_heads)
      .def_rw("q_len", &AttentionCall::q_len)
      .def_rw("k_len", &AttentionCall::k_len)
      .def_rw("training", &AttentionCall::training)
      .def_rw("dropout", &AttentionCall::dropout)
      .def_rw("deterministic", &AttentionCall::deterministic)
      .def_prop_rw(
          "mask_dtype",
          [](const AttentionCall& c) {
            return c.mask_dtype ? std::optional<std::string>(std::string(to_string(*c.mask_dtype))) : std::nullopt;
          },
          [](AttentionCall& c, const std::optional<std::string>& v) {
            c.mask_dtype = v ? std::optional(from_name(*v, kElements, "mask_dtype")) : std::nullopt;
          },
          nb::arg("value").none())
      .def("validate", [](const AttentionCall& c) {
        if (Status s = c.validate(); !s.ok()) raise(s);
      });

  auto env = nb::class_<Environment>(m, "Environment", "Where the call runs: GPU architecture and libraries.")
                 .def(nb::init<>())
                 .def_rw("sm", &Environment::sm)
                 .def_prop_rw(
                     "available",
                     [](const Environment& e) {
                       std::set<std::string> out;
                       for (const FamilyInfo& f : kFamilies)
                         if (e.has(f.bit)) out.insert(std::string(f.name));
                       return out;
                     },
                     [](Environment& e, const std::set<std::string>& names) {
                       std::uint32_t bits = 0;
                       for (const std::string& n : names) {
                         const FamilyInfo* f = family_named(n);
                         if (!f)
                           raise(error(ErrorCode::invalid_argument,
                                       "environment.available: unknown family '" + n + "' (" + family_names() + ")"));
                         bits |= f->bit;
                       }
                       e.available = bits;
                     })
                 .def("validate", [](const Environment& e) {
                   if (Status s = e.validate(); !s.ok()) raise(s);
                 });
  version_property(env, "torch", &Environment::torch);
  version_property(env, "cudnn", &Environment::cudnn);
  for (const FamilyInfo& f : kFamilies)
    if (f.version) version_property(env, f.version_field.data(), f.version);
}

// The typed call decide() returns (backend_call.hpp) and its rendered arguments (call_args.hpp).
void bind_typed_call(nb::module_& m) {
  nb::class_<SdpaArgs>(m, "SdpaArgs", "F.scaled_dot_product_attention's arguments and the kernel to force.")
      .def_prop_ro("type", [](const SdpaArgs&) { return "sdpa"; })
      .def_prop_ro("kernel", [](const SdpaArgs& a) { return std::string(to_string(a.kernel)); })
      .def_ro("is_causal", &SdpaArgs::is_causal)
      .def_ro("causal_lower_right", &SdpaArgs::causal_lower_right)
      .def_ro("enable_gqa", &SdpaArgs::enable_gqa);
  nb::class_<KernelArgs>(m, "KernelArgs", "A fixed-length kernel's own mask arguments (flash-attn, xformers, ...).")
      .def_prop_ro("type", [](const KernelArgs&) { return "kernel"; })
      .def_ro("causal", &KernelArgs::causal)
      .def_prop_ro("alignment", [](const KernelArgs& a) { return std::string(to_string(a.alignment)); })
      .def_ro("window_left", &KernelArgs::window_left)
      .def_ro("window_right", &KernelArgs::window_right)
      .def_ro("chunk", &KernelArgs::chunk);
  nb::class_<VarlenArgs>(m, "VarlenArgs", "Variable-length attention: sequences cut from the padded tensors.")
      .def_prop_ro("type", [](const VarlenArgs&) { return "varlen"; })
      .def_prop_ro(
          "sequences",
          [](const VarlenArgs& a) {
            std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>> out;
            out.reserve(a.sequences.size());
            for (const Sequence& s : a.sequences) out.emplace_back(s.batch, s.q.start, s.q.end, s.k.start, s.k.end);
            return out;
          },
          "(batch, q_start, q_end, k_start, k_end) per sequence, in packing order.")
      .def_ro("packed", &VarlenArgs::packed)
      .def_ro("causal", &VarlenArgs::causal)
      .def_ro("window_left", &VarlenArgs::window_left)
      .def_ro("window_right", &VarlenArgs::window_right)
      .def_prop_ro("cu_seqlens_q", &VarlenArgs::cu_seqlens_q)
      .def_prop_ro("cu_seqlens_k", &VarlenArgs::cu_seqlens_k)
      .def_prop_ro("max_seqlen_q", &VarlenArgs::max_seqlen_q)
      .def_prop_ro("max_seqlen_k", &VarlenArgs::max_seqlen_k);
  nb::class_<FlexArgs>(m, "FlexArgs", "flex_attention with a BlockMask of block_q x block_k tiles.")
      .def_prop_ro("type", [](const FlexArgs&) { return "flex"; })
      .def_ro("block_q", &FlexArgs::block_q)
      .def_ro("block_k", &FlexArgs::block_k)
      .def_ro("mask_mod_reads_mask", &FlexArgs::mask_mod_reads_mask);

  nb::class_<Call>(m, "Call", "One attention call: backend, what happens to the mask, typed arguments.")
      .def_prop_ro("backend", [](const Call& c) { return std::string(to_string(c.backend)); })
      .def_prop_ro("mask", [](const Call& c) { return std::string(to_string(c.mask)); })
      .def_prop_ro("mask_cast",
                   [](const Call& c) {
                     return c.mask_cast ? std::optional<std::string>(std::string(to_string(*c.mask_cast)))
                                        : std::nullopt;
                   })
      .def_prop_ro("mask_form", [](const Call& c) { return std::string(to_string(c.mask_form)); })
      .def_prop_ro(
          "args",
          [](const Call& c) -> nb::object {
            return std::visit(
                [](const auto& a) -> nb::object {
                  if constexpr (std::is_same_v<std::decay_t<decltype(a)>, std::monostate>) return nb::none();
                  else return nb::cast(a);
                },
                c.args);
          },
          "SdpaArgs, KernelArgs, VarlenArgs, FlexArgs, or None (a zeros step, a plan's summary call).")
      .def(
          "rendered",
          [](const Call& c, std::int64_t batch, std::int64_t q_len, std::int64_t k_len) {
            const CallArgs r = backend_args(c, batch, q_len, k_len);
            nb::object object = nb::none();
            if (!r.mask_object.empty()) {
              nb::dict o;
              o["name"] = nb::str(r.mask_object.data(), r.mask_object.size());
              o["args"] = py_args(r.mask_object_args);
              object = o;
            }
            return std::make_pair(py_args(r.args), object);
          },
          "batch"_a, "q_len"_a, "k_len"_a,
          "(keyword arguments under the library's own names, mask object {name, args} or None).");

}

// decide() and its answer (policy.hpp).
void bind_policy(nb::module_& m) {
  nb::class_<PlanStep>(m, "PlanStep", "One call of a plan on q[batch, :, q_range] and k/v[batch, :, k_range].")
      .def_ro("call", &PlanStep::call)
      .def_ro("batch", &PlanStep::batch)
      .def_prop_ro("q_range", [](const PlanStep& p) { return pair_of(p.q_range); })
      .def_prop_ro("k_range", [](const PlanStep& p) { return pair_of(p.k_range); });

  nb::class_<Rejection>(m, "Rejection", "A backend not chosen: kind, reason and where the rule comes from.")
      .def_prop_ro("backend", [](const Rejection& r) { return std::string(to_string(r.backend)); })
      .def_prop_ro("kind", [](const Rejection& r) { return std::string(to_string(r.kind)); })
      .def_prop_ro("reason", &Rejection::reason)
      .def_prop_ro("source", [](const Rejection& r) { return std::string(r.source); })
      .def_prop_ro("rules",
                   [](const Rejection& r) {
                     std::vector<std::string> out;
                     if (r.kind == RejectionKind::refused)
                       r.refusals.for_each([&](const Rule& rule) { out.emplace_back(rule.name); });
                     return out;
                   })
      .def_prop_ro("defect",
                   [](const Rejection& r) {
                     return r.kind == RejectionKind::defect && r.defect ? std::optional<std::string>(std::string(r.defect->id))
                                                                        : std::nullopt;
                   })
      .def_prop_ro("cost_ms", [](const Rejection& r) {
        return r.kind == RejectionKind::slower ? std::optional<double>(r.cost_ms) : std::nullopt;
      })
      .def_prop_ro("compile_ms", [](const Rejection& r) {
        return r.kind == RejectionKind::slower ? std::optional<double>(r.compile_ms) : std::nullopt;
      }, "slower: the part of cost_ms a cold FlexAttention compile is (DecideOptions::flex_compile_ms)");

  nb::class_<Hazard>(m, "Hazard")
      .def_prop_ro("kind", [](const Hazard& h) { return std::string(to_string(h.kind)); })
      .def_ro("detail", &Hazard::detail);

  nb::class_<Policy>(m, "Policy", "decide()'s answer: the call (or a plan), every rejection, the hazards.")
      .def_ro("call", &Policy::call)
      .def_ro("plan", &Policy::plan)
      .def_ro("rejected", &Policy::rejected)
      .def_ro("hazards", &Policy::hazards)
      .def_ro("cost_ms", &Policy::cost_ms)
      .def_prop_ro("is_plan", &Policy::is_plan)
      .def_prop_ro("backend", [](const Policy& p) { return std::string(to_string(p.call.backend)); });

  m.def(
      "decide",
      [](const MaskStructure& s, const AttentionCall& call, const Environment& env, std::int64_t max_plan_calls,
         double flex_compile_ms, double mask_build_ms) {
        DecideOptions options;
        options.max_plan_calls = max_plan_calls;
        options.flex_compile_ms = flex_compile_ms;
        options.mask_build_ms = mask_build_ms;
        return take(decide(s, call, env, options));
      },
      "structure"_a, "call"_a, "environment"_a, "max_plan_calls"_a = 64, "flex_compile_ms"_a = 0.0,
      "mask_build_ms"_a = 0.0,
      "The backend and typed call that compute the structure correctly and fastest (docs/policy.md); "
      "flex_compile_ms: what a FlexAttention call would spend compiling first (0: warm); mask_build_ms: what "
      "building the dense mask costs a call that keeps it (0: the mask is at hand; +inf: never build it).");
  m.attr("FLEX_COLD_COMPILE_MS") = kFlexColdCompileMs;
  m.def("format_ms", [](double ms) { return format_ms(ms); }, "ms"_a,
        "Milliseconds as the rejections' reasons and the CLI print them ('69.9 ms', '0.037 ms').");
}

// The families and backends tables (families.hpp kFamilies, backends/registry.hpp) as plain
// read-only lists: what the Python package builds its own tables from.
void bind_tables(nb::module_& m) {
  m.def(
      "families",
      [] {
        nb::list out;
        for (const FamilyInfo& f : kFamilies) {
          nb::dict d;
          d["name"] = std::string(f.name);
          d["bit"] = static_cast<std::uint32_t>(f.bit);
          d["version_field"] = f.version ? nb::cast(std::string(f.version_field)) : nb::none();
          d["default_version"] = f.version ? nb::cast(f.default_version.to_string()) : nb::none();
          d["python_module"] = f.python_module.empty() ? nb::none() : nb::cast(std::string(f.python_module));
          std::vector<std::string> distributions;
          for (std::string_view rest = f.distributions; !rest.empty();) {
            const std::size_t comma = rest.find(',');
            distributions.emplace_back(rest.substr(0, comma));
            rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
          }
          d["distributions"] = distributions;
          d["host"] = std::string(f.host);
          d["default_available"] = Environment{}.has(f.bit);
          out.append(d);
        }
        return out;
      },
      "Every backend family, in table order: {name (as Environment.available spells it), bit, version_field (the "
      "Environment property holding its library's version; None: it has none of its own), default_version (the "
      "CLI's; None without a version_field), python_module (the module whose import finds it installed; None for "
      "torch and flex, which come with torch), distributions (the distributions whose metadata carry its version, "
      "the first installed wins), host (the Python package deciding for it: 'torch' or 'jax'), default_available "
      "(in a default Environment's available)}.");
  m.def(
      "backends",
      [] {
        static constexpr const char* kWork[] = {"attended", "every_pair", "flex_tiles"};
        nb::list out;
        for (const BackendInfo& b : backends::kRegistry) {
          nb::dict d;
          d["name"] = std::string(b.name);
          d["family"] = std::string(family_info(b.id).name);
          d["takes_dense_mask"] = b.dense != nullptr;
          d["native_rate"] = b.rates.native;
          d["dense_rate"] = b.rates.dense;
          d["rates_measured"] = b.rates.measured;
          d["work"] = kWork[static_cast<std::size_t>(b.work)];
          d["plan_step"] = b.plan_rank > 0;
          std::vector<std::string> rules;
          for (const Rule& r : b.rules) rules.emplace_back(r.name);
          d["rules"] = rules;
          out.append(d);
        }
        return out;
      },
      "Every backend decide() judges, in registry order: {name (as Call.backend spells it), family (a families() "
      "name), takes_dense_mask, native_rate and dense_rate (ms per unit of work, cost.hpp; dense_rate 0: takes "
      "none), rates_measured, work ('attended', 'every_pair' or 'flex_tiles'), plan_step (a torch kernel a plan's "
      "steps may use), rules (its capability rules' names, in order)}.");
}

// The JSON contract (docs/json.md, schema 2) from json.hpp, the one writer the CLI's --json
// uses too: masklens.Report.to_dict() parses what this returns.
void bind_json(nb::module_& m) {
  m.attr("JSON_SCHEMA") = kJsonSchema;
  m.def(
      "report_json",
      [](const MaskStructure& s, const Policy* policy, const TileSummary* tiles) {
        nlohmann::json doc = to_json(s, policy);
        if (tiles) doc["tiles"] = to_json(take(block_mask_tensors(*tiles)), tiles->tally());
        return doc.dump();
      },
      "structure"_a, "policy"_a.none(), "tiles"_a.none() = nb::none(),
      "The inspect document (docs/json.md) of a structure, its policy (None: decide() failed) and a tile "
      "summary (None: not counted), as the CLI's --json writes it (compact).");
}

// Context parallelism: a table's runs from row shards (masklens.distributed). Spans are
// a monoid over row shards, so each rank scans its own rows into runs (O(runs), tiny for
// the masks frameworks pass), the ranks all_gather them, and every rank classifies the
// same merged runs (docs/distributed.md). Runs cross as int64 [n, 8] arrays of (row,
// length, first, last, d_first, d_last, count, flags), the columns and order of
// Verdict.runs.
void bind_context_parallelism(nb::module_& m) {
  m.def(
      "scan_runs",
      [](nb::ndarray<nb::ro, nb::device::cpu> mask, float masked_threshold, int threads) {
        const MaskView view = host_view(mask, masked_threshold);
        auto* runs = new SpanRuns;
        nb::capsule owner(runs, [](void* p) noexcept { delete static_cast<SpanRuns*>(p); });
        {
          nb::gil_scoped_release unlocked;
          Result<SpanTable> spans = scan(view, scan_options_for(view, threads));
          Status failed = spans ? Status{} : spans.status();
          if (failed.ok()) {
            // Not classified here: a shard's own verdict means nothing, only the merge's.
            Result<SpanRuns> encoded = SpanRuns::encode(*spans);
            if (encoded) *runs = std::move(encoded).value();
            else failed = encoded.status();
          }
          if (!failed.ok()) {
            nb::gil_scoped_acquire locked;
            raise(failed);
          }
        }
        static_assert(sizeof(SpanRun) == 8 * sizeof(std::int64_t), "eight int64 columns a run");
        // (row, length, first, last, d_first, d_last, count) as stored; flags | reserved
        // read as one int64 is the flags where reserved is 0, as every scanner stores it.
        const std::size_t shape[2] = {runs->runs.size(), 8};
        nb::ndarray<nb::numpy, const std::int64_t, nb::ndim<2>> array(
            reinterpret_cast<const std::int64_t*>(runs->runs.data()), 2, shape, owner);
        const std::vector<std::int64_t> table{runs->batch, runs->heads, runs->q_len, runs->k_len,
                                              runs->distinct_batch, runs->distinct_heads};
        return nb::make_tuple(table, array);
      },
      "mask"_a, "masked_threshold"_a = -1000.0f, "threads"_a = 0,
      "Scan a host mask (or a shard of its rows) into span runs without classifying it: (table shape [batch, "
      "heads, q_len, k_len, distinct_batch, distinct_heads], int64 [runs, 8] of (row, length, first, last, d_first, "
      "d_last, count, flags)). MaskError naming the first bad element.");

  m.def(
      "classify_runs",
      [](const std::vector<std::int64_t>& table,
         nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> rows) {
        if (table.size() != 6)
          raise(error(ErrorCode::invalid_argument, "table shape must be [batch, heads, q_len, k_len, distinct_batch, "
                                                   "distinct_heads], got " + std::to_string(table.size()) + " values"));
        if (rows.shape(1) != 8)
          raise(error(ErrorCode::invalid_argument,
                      "runs must be int64 [n, 8], got [" + std::to_string(rows.shape(0)) + ", " +
                          std::to_string(rows.shape(1)) + "]"));
        SpanRuns runs;
        runs.batch = table[0], runs.heads = table[1], runs.q_len = table[2], runs.k_len = table[3];
        runs.distinct_batch = table[4], runs.distinct_heads = table[5];
        runs.runs.resize(rows.shape(0));
        for (std::size_t i = 0; i < runs.runs.size(); ++i) {
          const std::int64_t* r = rows.data() + 8 * i;
          SpanRun& run = runs.runs[i];
          run.row = r[0], run.length = r[1], run.first = r[2], run.last = r[3];
          run.d_first = r[4], run.d_last = r[5], run.count = r[6];
          if (r[7] < 0 || r[7] > UINT32_MAX)
            raise(error(ErrorCode::invalid_argument, "run " + std::to_string(i) + " flags " + std::to_string(r[7]) +
                                                         " are not 32-bit row flags"));
          run.flags = static_cast<std::uint32_t>(r[7]);
        }
        if (Status st = runs.validate(); !st.ok()) raise(st);
        return verdict_unlocked(std::move(runs));  // as a device scan's finish() words a NaN row
      },
      "table"_a, "runs"_a,
      "The Verdict of span runs that tile a whole table (any cutting: the runs of row shards put in row order), "
      "classified in O(runs); the Verdict keeps them (Verdict.runs). MaskError for runs that do not tile the rows "
      "in order, or a row flagged NaN / +inf.");
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "masklens C++ core: scan, classify and decide on typed values";
  // A BlockMask's tensors share a BlockMaskTensors' memory, and torch keeps BlockMasks
  // until the interpreter ends (compiled graphs' constants, Dynamo's caches): nanobind
  // would report them as leaked at every exit of a training program.
  nb::set_leak_warnings(false);
  m.attr("__version__") = "0.1.0";
  nb::exception<StatusError>(m, "MaskError", PyExc_RuntimeError);

  bind_structure(m);
  bind_scan(m);
  bind_tiles(m);
  bind_call_and_environment(m);
  bind_typed_call(m);
  bind_policy(m);
  bind_tables(m);
  bind_json(m);
  bind_context_parallelism(m);
  masklens::python::bind_definition(m, [](SpanRuns runs) { return verdict_unlocked(std::move(runs)); });
}
