// The binding of definition.hpp: masklens._definition hands the parsed tree, its tables'
// runs and the lengths; one call gives the rows' pieces and their verdict.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <masklens/definition.hpp>
#include <masklens/verdict.hpp>

#include <cstdint>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "status_error.hpp"
#include "table_binding.hpp"

namespace masklens::python {

namespace nb = nanobind;
using Int64s = nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int64Table = nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// (rule, a, b, table, scope, (children...)) as _definition.encode() writes a node.
inline definition::Node node_from(nb::handle h) {
  using definition::Rule;
  static const std::pair<const char*, Rule> kRules[] = {
      {"causal", Rule::causal},   {"bidirectional", Rule::bidirectional},
      {"sliding", Rule::sliding}, {"sliding_bidirectional", Rule::sliding_bidirectional},
      {"chunked", Rule::chunked}, {"padding", Rule::padding},
      {"packed", Rule::packed},   {"blocks", Rule::blocks},
      {"and", Rule::all_of},      {"or", Rule::any_of},
      {"offsets", Rule::offsets}, {"remap", Rule::remap}};
  const auto t = nb::cast<nb::tuple>(h);
  if (t.size() != 6) raise(error(ErrorCode::invalid_argument, "a definition node is (rule, a, b, table, scope, children)"));
  const auto name = nb::cast<std::string>(t[0]);
  definition::Node n;
  bool known = false;
  for (const auto& [rule_name, rule] : kRules)
    if (name == rule_name) n.rule = rule, known = true;
  if (!known) raise(error(ErrorCode::invalid_argument, "no definition rule named " + name));
  n.a = nb::cast<std::int64_t>(t[1]), n.b = nb::cast<std::int64_t>(t[2]);
  n.table = nb::cast<int>(t[3]), n.scope = nb::cast<int>(t[4]);
  for (nb::handle child : nb::cast<nb::tuple>(t[5])) n.children.push_back(node_from(child));
  return n;
}

inline std::vector<std::int64_t> values_of(nb::handle h) {
  const auto a = nb::cast<Int64s>(h);
  return {a.data(), a.data() + a.shape(0)};
}

// Runs from their columns (int64 arrays), checked to tile every batch and indexed.
inline definition::TableRuns runs_from_columns(std::int64_t batches, std::int64_t length, nb::handle batch,
                                               nb::handle start, nb::handle end, nb::handle value) {
  definition::TableRuns runs;
  runs.batches = batches, runs.length = length;
  runs.batch = values_of(batch), runs.start = values_of(start), runs.end = values_of(end);
  runs.value = values_of(value);
  if (Status s = runs.index(); !s.ok()) raise(s);
  return runs;
}

// tables: each its runs, a TableRuns (the device pass's, as it is) or (batches, length,
// batch, start, end, value), or a table in host memory to read here, (data, element,
// batch, length, batch stride, length stride, positions) (table_binding.hpp; the caller
// keeps it alive); lists: int64 arrays.
inline definition::Definition definition_from(nb::handle tree, nb::list tables, nb::list lists) {
  definition::Definition d;
  d.root = node_from(tree);
  for (nb::handle h : tables) {
    if (definition::TableRuns* runs = nullptr; nb::try_cast<definition::TableRuns*>(h, runs) && runs != nullptr) {
      d.tables.push_back(*runs);  // read on the device (masklens._cuda), already indexed
      continue;
    }
    const auto t = nb::cast<nb::tuple>(h);
    if (t.size() == 7) {
      d.tables.push_back(take(read_table_runs(table_view_from(t), "table " + std::to_string(d.tables.size()))));
      continue;
    }
    if (t.size() != 6)
      raise(error(ErrorCode::invalid_argument,
                  "a table is a TableRuns, (batches, length, batch, start, end, value) or (data, element, batch, "
                  "length, batch_stride, length_stride, positions)"));
    d.tables.push_back(
        runs_from_columns(nb::cast<std::int64_t>(t[0]), nb::cast<std::int64_t>(t[1]), t[2], t[3], t[4], t[5]));
  }
  for (nb::handle h : lists) d.lists.push_back(values_of(h));
  return d;
}

// int64 [pieces, 7]: (batch, lo, hi, begin k, begin c, end k, end c).
inline nb::ndarray<nb::numpy, std::int64_t, nb::ndim<2>> pieces_array(const std::vector<definition::Piece>& pieces) {
  auto* data = new std::vector<std::int64_t>;
  data->reserve(pieces.size() * 7);
  for (const definition::Piece& p : pieces)
    data->insert(data->end(), {p.batch, p.lo, p.hi, p.begin.k, p.begin.c, p.end.k, p.end.c});
  nb::capsule owner(data, [](void* v) noexcept { delete static_cast<std::vector<std::int64_t>*>(v); });
  const std::size_t shape[2] = {pieces.size(), 7};
  return {data->data(), 2, shape, owner};
}

// What a definition's values cannot say (an invalid_value Status) comes back as its
// message, for the caller to build the mask instead; any other error raises.
template <class T>
nb::object or_reason(Result<T>& r) {
  if (r.ok()) return nb::none();
  if (r.status().code() == ErrorCode::invalid_value) return nb::str(r.status().message().c_str());
  raise(r.status());
  return nb::none();
}

template <class VerdictOf>
void bind_definition(nb::module_& m, VerdictOf verdict_of_runs) {
  using namespace nb::literals;
  using definition::TableRuns;
  // The runs masklens._cuda reads on the device hand over as they are (one object a table,
  // indexed): read_definition takes them without a crossing through arrays; the columns
  // are there for whoever looks (masklens._table_runs.TableRuns' names).
  nb::class_<TableRuns>(m, "TableRuns", "A [batch, length] table's runs of equal values (definition.hpp).")
      .def(
          "__init__",
          [](TableRuns* self, std::int64_t batches, std::int64_t length, nb::handle batch, nb::handle start,
             nb::handle end, nb::handle value) {
            // Checked before the object exists: nothing half made.
            new (self) TableRuns(runs_from_columns(batches, length, batch, start, end, value));
          },
          "batches"_a, "length"_a, "batch"_a, "start"_a, "end"_a, "value"_a,
          "Runs sorted by batch and start that tile every batch's positions (checked).")
      .def_ro("batch", &TableRuns::batches, "the table's batches")
      .def_ro("length", &TableRuns::length)
      .def_prop_ro(
          "b", [](const TableRuns& r) { return int64_array(r.batch); }, nb::rv_policy::automatic, "each run's batch")
      .def_prop_ro("start", [](const TableRuns& r) { return int64_array(r.start); }, nb::rv_policy::automatic)
      .def_prop_ro("end", [](const TableRuns& r) { return int64_array(r.end); }, nb::rv_policy::automatic)
      .def_prop_ro("value", [](const TableRuns& r) { return int64_array(r.value); }, nb::rv_policy::automatic)
      .def("as_tuple", [](const TableRuns& r) { return runs_tuple(r); },
           "(batches, length, batch, start, end, value), as masklens._core.table_runs gives them");
  m.def(
      "definition_pieces",
      [](nb::handle tree, nb::list tables, nb::list lists, std::int64_t batches, Int64Table starts,
         std::int64_t k_len) -> nb::object {
        const definition::Definition d = definition_from(tree, tables, lists);
        if (starts.shape(1) != 7) raise(error(ErrorCode::invalid_argument, "starts must be int64 [n, 7]"));
        std::vector<definition::Start> from;
        for (std::size_t i = 0; i < starts.shape(0); ++i) {
          const std::int64_t* s = starts.data() + 7 * i;
          from.push_back({s[0], s[1], s[2], {s[3], s[4]}, {s[5], s[6]}});
        }
        Result<std::vector<definition::Piece>> r = definition::evaluate(d, batches, from, k_len);
        if (!r) return or_reason(r);
        return nb::cast(pieces_array(*r));
      },
      "tree"_a, "tables"_a, "lists"_a, "batches"_a, "starts"_a, "k_len"_a,
      "The pieces (int64 [n, 7]: batch, lo, hi, begin k, begin c, end k, end c) of a definition's rows from starts "
      "(int64 [n, 7]: batch, lo, hi, query value k, c, shift k, c), keys clipped to [0, k_len) where k_len >= 0; "
      "the reason (str) where its values are not one interval a row.");
  m.def(
      "table_runs",
      [](nb::handle table) { return runs_tuple(take(read_table_runs(table_view_from(table)))); }, "table"_a,
      "The runs of a table in host memory (include/masklens/table_runs.hpp): table is (data pointer, 'bool' / "
      "'int32' / 'int64', batch, length, batch stride, length stride, positions), kept alive by the caller; "
      "returns (batches, length, batch, start, end, value).");
  m.def(
      "read_definition",
      [verdict_of_runs](nb::handle tree, nb::list tables, nb::list lists, std::int64_t batches, std::int64_t q_len,
                        std::int64_t k_len, std::int64_t q_offset, std::int64_t kv_offset) -> nb::object {
        const definition::Definition d = definition_from(tree, tables, lists);
        Result<std::vector<definition::Piece>> r = definition::rows(d, batches, q_len, k_len, q_offset, kv_offset);
        if (!r) return or_reason(r);
        return nb::make_tuple(verdict_of_runs(definition::span_runs(*r, batches, q_len, k_len)), pieces_array(*r));
      },
      "tree"_a, "tables"_a, "lists"_a, "batches"_a, "q_len"_a, "k_len"_a, "q_offset"_a, "kv_offset"_a,
      "(Verdict, pieces) of a [batches, 1, q_len, k_len] mask from its definition (definition.hpp), or the reason "
      "(str) where its values are not one interval a row: the verdict a scan of the built mask gives. Each table is "
      "its runs or a table in host memory, read here (table_runs).");
}

}  // namespace masklens::python
