// definition.hpp: a mask's rows from its definition, against the definition evaluated
// element by element.
//   * random compositions of every rule over random tables (batches 1-3, lengths <= 24,
//     offsets, windows, chunks, documents, blocks, padding with and without holes,
//     positions along documents): where evaluate() answers, every row's keys are exactly
//     the elements the rules let attend, one interval each; where a row's elements are
//     not one interval, it answers invalid_value (never a wrong row);
//   * span_runs() of the pieces classifies to the verdict of the table of those rows (one
//     table for every batch where the batches' rows are the same, as a scan of a
//     broadcast mask finds them);
//   * each value check names what it found; malformed table runs are refused.
#include <doctest/doctest.h>

#include <masklens/classify.hpp>
#include <masklens/classify_runs.hpp>
#include <masklens/definition.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "support/mask_gen.hpp"
#include "support/structure_fields.hpp"

using namespace masklens;
using masklens::definition::Definition;
using masklens::definition::Node;
using masklens::definition::Piece;
using masklens::definition::TableRuns;
namespace def = masklens::definition;
using masklens::testing::Rng;

namespace {

// A table as values [batch][position], and as runs.
using Values = std::vector<std::vector<std::int64_t>>;

TableRuns runs_of(const Values& v, bool positions) {
  TableRuns t;
  t.batches = static_cast<std::int64_t>(v.size());
  t.length = v.empty() ? 0 : static_cast<std::int64_t>(v[0].size());
  for (std::int64_t b = 0; b < t.batches; ++b) {
    for (std::int64_t j = 0; j < t.length; ++j) {
      const std::int64_t key = v[b][j] - (positions ? j : 0);
      if (j > 0 && key == v[b][j - 1] - (positions ? j - 1 : 0)) continue;
      if (!t.start.empty() && t.batch.back() == b) t.end.back() = j;
      t.batch.push_back(b), t.start.push_back(j), t.end.push_back(t.length), t.value.push_back(key);
    }
  }
  REQUIRE(t.index().ok());
  return t;
}

struct Case {
  Definition d;
  std::vector<Values> tables;  // as values, beside d.tables
  std::vector<bool> positions;
  std::int64_t batches = 1, q_len = 1, k_len = 1, q_offset = 0, kv_offset = 0;
};

int add_table(Case& c, Values v, bool positions) {
  c.d.tables.push_back(runs_of(v, positions));
  c.tables.push_back(std::move(v));
  c.positions.push_back(positions);
  return static_cast<int>(c.tables.size()) - 1;
}

std::int64_t pick(Rng& rng, std::int64_t lo, std::int64_t hi) { return masklens::testing::uniform(rng, lo, hi); }

// Ids that change every few positions (documents, blocks), sometimes repeating an id.
Values ids(Rng& rng, std::int64_t batches, std::int64_t length, bool negatives) {
  Values v(static_cast<std::size_t>(batches));
  for (auto& row : v) {
    std::int64_t id = negatives ? -1 : 0;
    for (std::int64_t j = 0; j < length; ++j) {
      if (j > 0 && pick(rng, 0, 3) == 0) id = pick(rng, 0, 9) == 0 ? 0 : id + pick(rng, 1, 2);
      row.push_back(negatives && pick(rng, 0, 2) == 0 ? -1 : id);
    }
  }
  return v;
}

Node random_node(Rng& rng, Case& c, int depth) {
  const std::int64_t L = c.k_len + c.kv_offset + 4;  // tables a little longer than the keys
  Node n;
  const int choice = static_cast<int>(pick(rng, 0, depth > 0 ? 11 : 8));
  switch (choice) {
    case 0: n.rule = def::Rule::causal; break;
    case 1: n.rule = def::Rule::bidirectional; break;
    case 2: n.rule = def::Rule::sliding, n.a = pick(rng, 1, 6); break;
    case 3: n.rule = def::Rule::sliding_bidirectional, n.a = pick(rng, 0, 4); break;
    case 4: {
      n.rule = def::Rule::chunked, n.a = pick(rng, 1, 6);
      std::vector<std::int64_t> left;
      for (std::int64_t b = 0; b < c.batches; ++b) left.push_back(pick(rng, 0, 3));
      c.d.lists.push_back(left);
      n.table = static_cast<int>(c.d.lists.size()) - 1;
      break;
    }
    case 5: {
      n.rule = def::Rule::padding;
      Values v(static_cast<std::size_t>(c.batches), std::vector<std::int64_t>(static_cast<std::size_t>(L), 0));
      for (auto& row : v) {
        const std::int64_t from = pick(rng, 0, L / 2), to = pick(rng, from, L);
        for (std::int64_t j = from; j < to; ++j) row[j] = 1;
        if (pick(rng, 0, 5) == 0) row[pick(rng, 0, L - 1)] ^= 1;  // a hole, sometimes
      }
      n.table = add_table(c, std::move(v), false);
      break;
    }
    case 6: case 7: {
      n.rule = choice == 6 ? def::Rule::packed : def::Rule::blocks;
      n.table = add_table(c, ids(rng, c.batches, L, choice == 7), false);
      break;
    }
    case 8: n.rule = def::Rule::causal; break;
    case 9: n.rule = def::Rule::offsets, n.a = pick(rng, 0, 3), n.b = pick(rng, 0, 3); break;
    case 10: case 11: n.rule = choice == 10 ? def::Rule::all_of : def::Rule::any_of; break;
  }
  if (n.rule == def::Rule::offsets) n.children.push_back(random_node(rng, c, depth - 1));
  if (n.rule == def::Rule::all_of || n.rule == def::Rule::any_of) {
    // An AND with packed documents may hold a remap onto their positions.
    if (n.rule == def::Rule::all_of && pick(rng, 0, 2) == 0) {
      Node p;
      p.rule = def::Rule::packed;
      Values v = ids(rng, c.batches, L, false);
      Values numbered = v;  // documents numbered from 0, as positions make them
      for (auto& row : numbered) {
        std::int64_t id = 0;
        for (std::size_t j = 0; j < row.size(); ++j) {
          if (j > 0 && row[j] != row[j - 1]) ++id;
          row[j] = id;
        }
      }
      p.table = add_table(c, numbered, false);
      n.children.push_back(p);
      if (pick(rng, 0, 1) == 0) {
        Node r;
        r.rule = def::Rule::remap;
        Values pos = numbered;  // each document's positions rise by one from 0, 1 or 2
        for (std::size_t b = 0; b < pos.size(); ++b)
          for (std::size_t j = 0; j < pos[b].size(); ++j)
            pos[b][j] = j == 0 || numbered[b][j] != numbered[b][j - 1] ? pick(rng, 0, 2) : pos[b][j - 1] + 1;
        r.table = add_table(c, std::move(pos), true);
        r.scope = p.table;
        r.children.push_back(random_node(rng, c, depth - 1));
        n.children.push_back(r);
      }
    }
    for (std::int64_t i = pick(rng, 1, n.rule == def::Rule::any_of ? 4 : 2); i > 0; --i)
      n.children.push_back(random_node(rng, c, depth - 1));
  }
  return n;
}

std::int64_t at(const Values& v, std::int64_t b, std::int64_t j, bool& inside) {
  inside = j >= 0 && j < static_cast<std::int64_t>(v[b].size());
  return inside ? v[b][j] : 0;
}

// Whether key value kv attends query value qv of batch b under n (the rules element by
// element, as transformers' primitives define them; a table read outside is false).
bool member(const Case& c, const Node& n, std::int64_t b, std::int64_t qv, std::int64_t kv) {
  bool in_q = true, in_k = true;
  switch (n.rule) {
    case def::Rule::causal: return kv <= qv;
    case def::Rule::bidirectional: return qv >= 0;
    case def::Rule::sliding: return kv > qv - n.a;
    case def::Rule::sliding_bidirectional: return qv - kv <= n.a && kv - qv <= n.a;
    case def::Rule::chunked: {
      const std::int64_t left = c.d.lists[n.table][b];
      return definition::detail::floor_div(kv - left, n.a) == definition::detail::floor_div(qv - left, n.a);
    }
    case def::Rule::padding: return at(c.tables[n.table], b, kv, in_k) != 0 && in_k;
    case def::Rule::packed: {
      const std::int64_t q = at(c.tables[n.table], b, qv, in_q), k = at(c.tables[n.table], b, kv, in_k);
      return in_q && in_k && q == k;
    }
    case def::Rule::blocks: {
      const std::int64_t q = at(c.tables[n.table], b, qv, in_q), k = at(c.tables[n.table], b, kv, in_k);
      return in_q && in_k && q >= 0 && q == k;
    }
    case def::Rule::all_of:
      for (const Node& child : n.children)
        if (!member(c, child, b, qv, kv)) return false;
      return true;
    case def::Rule::any_of:
      for (const Node& child : n.children)
        if (member(c, child, b, qv, kv)) return true;
      return false;
    case def::Rule::offsets: return member(c, n.children[0], b, qv + n.a, kv + n.b);
    case def::Rule::remap: {
      const Values& docs = c.tables[n.scope];
      const std::int64_t dq = at(docs, b, qv, in_q), dk = at(docs, b, kv, in_k);
      if (!in_q || !in_k || dq != dk) return false;
      const Values& pos = c.tables[n.table];
      return member(c, n.children[0], b, pos[b][qv], pos[b][kv]);
    }
  }
  return false;
}

// The rows a scan of the dense mask would give: per row [begin, end), (0, 0) empty;
// false where a row's keys are not one interval.
bool reference_rows(const Case& c, std::vector<std::pair<std::int64_t, std::int64_t>>& rows) {
  rows.clear();
  for (std::int64_t b = 0; b < c.batches; ++b)
    for (std::int64_t q = 0; q < c.q_len; ++q) {
      std::int64_t begin = -1, end = -1;
      bool one = true;
      for (std::int64_t k = 0; k < c.k_len; ++k) {
        if (!member(c, c.d.root, b, q + c.q_offset, k + c.kv_offset)) continue;
        if (begin < 0) begin = k;
        else if (end != k) one = false;
        end = k + 1;
      }
      if (!one) return false;
      rows.push_back(begin < 0 ? std::pair<std::int64_t, std::int64_t>{0, 0} : std::pair{begin, end});
    }
  return true;
}

}  // namespace

TEST_CASE("definition: every answered row is the rules' elements; a row of two ranges is refused") {
  Rng rng(20261206);
  int answered = 0, refused = 0, two_ranges = 0, broadcast = 0;
  for (int i = 0; i < 6000; ++i) {
    Case c;
    c.batches = pick(rng, 1, 3), c.q_len = pick(rng, 1, 16), c.k_len = pick(rng, 1, 16);
    c.q_offset = pick(rng, 0, 1) ? 0 : pick(rng, 0, 4), c.kv_offset = pick(rng, 0, 1) ? 0 : pick(rng, 0, 4);
    c.d.root = random_node(rng, c, 3);
    std::vector<std::pair<std::int64_t, std::int64_t>> want;
    const bool intervals = reference_rows(c, want);
    const Result<std::vector<Piece>> got = definition::rows(c.d, c.batches, c.q_len, c.k_len, c.q_offset, c.kv_offset);
    if (!got) {
      CHECK_MESSAGE(got.status().code() == ErrorCode::invalid_value, got.status().to_string());
      ++refused;
      two_ranges += !intervals;
      continue;
    }
    ++answered;
    REQUIRE_MESSAGE(intervals, "case " << i << ": answered a definition with a row of two ranges");
    // The pieces tile each batch's rows in order, and give every row its keys.
    std::size_t row = 0;
    for (std::int64_t b = 0, p = 0; b < c.batches; ++b)
      for (std::int64_t q = 0; q < c.q_len; ++q, ++row) {
        while ((*got)[p].batch != b || (*got)[p].hi <= q) ++p;
        const Piece& piece = (*got)[p];
        REQUIRE(piece.lo <= q);
        const std::pair<std::int64_t, std::int64_t> keys{piece.begin.at(q), piece.end.at(q)};
        REQUIRE_MESSAGE(keys == want[row],
                        "case " << i << " batch " << b << " row " << q);
      }
    // span_runs classifies as the table of those rows does.
    SpanTable t;
    t.batch = c.batches, t.heads = 1, t.q_len = c.q_len, t.k_len = c.k_len, t.distinct_heads = 1;
    bool alike = true;
    for (std::size_t r = 0; r < want.size(); ++r) alike = alike && want[r] == want[r % c.q_len];
    t.distinct_batch = alike ? 1 : c.batches;
    broadcast += alike && c.batches > 1;
    for (std::int64_t r = 0; r < t.distinct_batch * c.q_len; ++r) {
      RowSpan s;
      const auto [begin, end] = want[r];
      if (end > begin) s.first = begin, s.last = end - 1, s.count = end - begin;
      else s.first = RowSpan::kNoKey, s.last = -1, s.count = 0;
      t.rows.push_back(s);
    }
    const SpanRuns runs = definition::span_runs(*got, c.batches, c.q_len, c.k_len);
    REQUIRE(runs.distinct_batch == t.distinct_batch);
    const Result<MaskStructure> from_table = classify(t), from_runs = classify(runs);
    REQUIRE(from_table.ok() == from_runs.ok());
    if (from_table.ok())
      REQUIRE_MESSAGE(testing::structure_fields(*from_table) == testing::structure_fields(*from_runs), "case " << i);
  }
  CHECK(answered > 3000);
  CHECK(refused > 100);
  CHECK(two_ranges > 20);
  CHECK(broadcast > 100);
}

TEST_CASE("definition: each value check names what it found") {
  const auto check = [](Definition d, std::int64_t batches, std::int64_t q_len, const std::string& why) {
    const Result<std::vector<Piece>> got = definition::rows(d, batches, q_len, 8, 0, 0);
    REQUIRE_FALSE(got.ok());
    CHECK(got.status().code() == ErrorCode::invalid_value);
    CHECK_MESSAGE(got.status().message().find(why) != std::string::npos, got.status().message());
  };
  const auto table = [](Values v, bool positions = false) { return runs_of(v, positions); };
  Definition holes;
  holes.root = {def::Rule::padding, 0, 0, 0, -1, {}};
  holes.tables.push_back(table({{0, 1, 1, 0, 1, 1, 0, 0}}));
  check(holes, 1, 8, "padding_mask with holes");

  Definition twice;
  twice.root = {def::Rule::packed, 0, 0, 0, -1, {}};
  twice.tables.push_back(table({{0, 0, 1, 1, 0, 0, 2, 2}}));
  check(twice, 1, 8, "packed_sequence_mask: a value appears in two separate runs");

  Definition few = twice;
  few.tables[0] = table({{0, 0, 0, 0, 1, 1, 1, 1}});
  check(few, 2, 8, "packed_sequence_mask has 1 batch rows");
  check(few, 1, 9, "packed_sequence_mask of length 8 is indexed outside it");

  Definition apart;  // keys [q - 1, q] or [q - 5, q - 4]
  Node window{def::Rule::all_of, 0, 0, -1, -1, {{def::Rule::causal, 0, 0, -1, -1, {}}, {def::Rule::sliding, 2, 0, -1, -1, {}}}};
  apart.root = {def::Rule::any_of, 0, 0, -1, -1, {window, {def::Rule::offsets, 0, 4, -1, -1, {window}}}};
  check(apart, 1, 8, "or_masks: a row attends two separate key ranges");

  Definition docs;  // positions whose documents are not the packed mask's
  docs.tables.push_back(table({{0, 0, 0, 0, 1, 1, 1, 1}}));
  docs.tables.push_back(table({{0, 1, 2, 0, 1, 2, 3, 4}}, true));
  docs.root = {def::Rule::all_of, 0, 0, -1, -1,
               {{def::Rule::packed, 0, 0, 0, -1, {}}, {def::Rule::remap, 0, 0, 1, 0, {{def::Rule::causal, 0, 0, -1, -1, {}}}}}};
  check(docs, 1, 8, "position_ids whose documents are not the packed_sequence_mask's");
  docs.tables[0] = table({{0, 0, 0, 0, 1, 2, 2, 2}});
  docs.tables[1] = table({{0, 1, 2, 3, -4, 5, 6, 7}}, true);
  check(docs, 1, 8, "negative position_ids");
}

TEST_CASE("definition: an OR's answer does not depend on the order of its children") {
  // Keys [q - 1, q + 1], [q - 4, q - 2] and [q - 7, q - 5]: one range together, while the
  // first and last alone are apart, so joining two at a time in that order would refuse.
  const auto around = [](std::int64_t shift) {
    return Node{def::Rule::offsets, 0, shift, -1, -1, {{def::Rule::sliding_bidirectional, 1, 0, -1, -1, {}}}};
  };
  std::vector<Node> children{around(0), around(6), around(3)};
  std::sort(children.begin(), children.end(), [](const Node& x, const Node& y) { return x.b < y.b; });
  int orders = 0;
  do {
    Definition d;
    d.root = {def::Rule::any_of, 0, 0, -1, -1, children};
    const Result<std::vector<Piece>> got = definition::rows(d, 1, 12, 12, 0, 0);
    REQUIRE_MESSAGE(got.ok(), got.status().to_string());
    for (std::int64_t q = 0; q < 12; ++q) {
      const auto piece = std::find_if(got->begin(), got->end(), [&](const Piece& p) { return p.lo <= q && q < p.hi; });
      REQUIRE(piece != got->end());
      CHECK(std::max<std::int64_t>(piece->begin.at(q), 0) == std::max<std::int64_t>(q - 7, 0));
      CHECK(std::min<std::int64_t>(piece->end.at(q), 12) == std::min<std::int64_t>(q + 2, 12));
    }
    ++orders;
  } while (std::next_permutation(children.begin(), children.end(),
                                 [](const Node& x, const Node& y) { return x.b < y.b; }));
  CHECK(orders == 6);
  // Nor does their grouping: an OR of an OR is one OR of all their children.
  for (std::size_t inner = 0; inner < 3; ++inner) {
    std::vector<Node> pair;
    for (std::size_t i = 0; i < 3; ++i)
      if (i != inner) pair.push_back(children[i]);
    Definition d;
    d.root = {def::Rule::any_of, 0, 0, -1, -1, {{def::Rule::any_of, 0, 0, -1, -1, pair}, children[inner]}};
    const Result<std::vector<Piece>> got = definition::rows(d, 1, 12, 12, 0, 0);
    REQUIRE_MESSAGE(got.ok(), got.status().to_string());
    for (const Piece& p : *got)
      for (std::int64_t q = p.lo; q < p.hi; ++q)
        CHECK(std::pair{p.begin.at(q), p.end.at(q)} == std::pair{std::max<std::int64_t>(q - 7, 0),
                                                                 std::min<std::int64_t>(q + 2, 12)});
  }
  // Parts whose joined lines are the same are one piece: every key, whatever the windows do.
  Definition everything;
  everything.root = {def::Rule::any_of, 0, 0, -1, -1,
                     {{def::Rule::bidirectional, 0, 0, -1, -1, {}}, around(0), around(3), around(6)}};
  const Result<std::vector<Piece>> all = definition::rows(everything, 1, 1000, 1000, 0, 0);
  REQUIRE(all.ok());
  CHECK(all->size() == 1);
  // Without the bridge the two ranges stay apart in either order.
  for (const std::int64_t first : {0, 6}) {
    Definition d;
    d.root = {def::Rule::any_of, 0, 0, -1, -1, {around(first), around(6 - first)}};
    const Result<std::vector<Piece>> got = definition::rows(d, 1, 12, 12, 0, 0);
    REQUIRE_FALSE(got.ok());
    CHECK(got.status().message().find("two separate key ranges") != std::string::npos);
  }
}

TEST_CASE("definition: parameters, lengths and positions past 2^40 are refused, never overflowed") {
  Definition wide;
  wide.root = {def::Rule::sliding_bidirectional, INT64_MAX, 0, -1, -1, {}};
  const Result<std::vector<Piece>> got = definition::rows(wide, 1, 4, 4, 0, 0);
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == ErrorCode::invalid_value);
  Definition chunks;
  chunks.root = {def::Rule::chunked, 4, 0, 0, -1, {}};
  chunks.lists.push_back({INT64_MIN});
  CHECK(definition::rows(chunks, 1, 4, 4, 0, 0).status().code() == ErrorCode::invalid_value);
  Definition causal;
  causal.root = {def::Rule::causal, 0, 0, -1, -1, {}};
  CHECK(definition::rows(causal, 1, 4, 4, INT64_MAX / 2, 0).status().code() == ErrorCode::invalid_shape);
  // A start whose query value rises by 2^40 a row over 2^40 rows: refused, never multiplied.
  const std::vector<def::Start> steep{{0, 0, std::int64_t{1} << 40, {std::int64_t{1} << 40, 0}, def::constant(0)}};
  const Result<std::vector<Piece>> steep_rows = definition::evaluate(causal, 1, steep, 4);
  REQUIRE_FALSE(steep_rows.ok());
  CHECK(steep_rows.status().message().find("rises by more than 1 a row") != std::string::npos);
  // An OR of nothing yet and a child: the empty start's unbounded ends are never subtracted.
  Definition either;
  either.root = {def::Rule::any_of, 0, 0, -1, -1, {{def::Rule::causal, 0, 0, -1, -1, {}}}};
  const Result<std::vector<Piece>> causal_rows = definition::rows(either, 1, 4, 4, 0, 0);
  REQUIRE(causal_rows.ok());
  CHECK(causal_rows->front().end.at(2) == 3);
}

TEST_CASE("definition: table runs that do not tile their batches are refused") {
  TableRuns t;
  t.batches = 1, t.length = 4;
  t.batch = {0, 0}, t.start = {0, 3}, t.end = {2, 4}, t.value = {1, 2};  // a gap at 2
  CHECK(t.index().code() == ErrorCode::invalid_argument);
  t.end = {3, 4};
  CHECK(t.index().ok());
  t.batches = 2;  // batch 1 has no runs
  CHECK(t.index().code() == ErrorCode::invalid_argument);
}
