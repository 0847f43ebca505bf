// definition.hpp: a mask known from its definition, never built.
//
// Frameworks compose masks from a few rules over O(B·L) metadata: causal, a sliding
// window, chunks, a padding mask, packed documents, VLM blocks, joined by AND / OR and
// shifted by offsets (transformers' masking_utils primitives are exactly these). Under
// such a composition every row's keys are one interval [begin, end), and both ends are
// piecewise linear in the row: on a piece of rows each is k * q + c. Pieces are cut where
// a table changes value along the rows, where a chunk starts and where two ends cross, so
// a definition has a few pieces per document, block or padding edge at any length.
//
// evaluate() works the rows out per piece from the tables' runs (TableRuns: the only
// thing read of the metadata, a few numbers a run), in O(pieces). Its rows are exactly a
// scan's of the dense bool mask the definition stands for (one interval a row, no
// flags), so span_runs() of them classifies to the scan's verdict; nothing [B, 1, Q, K]
// is written or read. What cannot be one interval a row (padding with holes, a document
// or block id in two runs, an OR of two ranges that do not meet, a position outside its
// table) is an invalid_value Status naming it: the caller builds the mask instead.
//
// Arithmetic is int64 with the unbounded ends at +-2^62 and every length, offset, window,
// chunk, padding and position within 2^40 (refused past it), so no sum of ends and rows
// overflows; the slope of a query value is 0 or 1 (a row index plus an offset, or a
// position along a document), which every rule that reads a table or a chunk by it
// checks. An OR joins all its operands at once (a child OR's children among them),
// whatever their order or grouping, and refuses a row whose ranges do not meet as it
// finds them: it may refuse a row that the keys' clip, an enclosing AND or a remap's
// document would leave one range, never answers a wrong one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "row_span.hpp"
#include "span_runs.hpp"
#include "status.hpp"

namespace masklens::definition {

// k * q + c over a piece of rows q.
struct Line {
  std::int64_t k = 0, c = 0;
  [[nodiscard]] constexpr std::int64_t at(std::int64_t q) const noexcept { return k * q + c; }
  friend constexpr bool operator==(Line, Line) noexcept = default;
};
constexpr Line operator+(Line a, Line b) noexcept { return {a.k + b.k, a.c + b.c}; }
constexpr Line operator-(Line a, Line b) noexcept { return {a.k - b.k, a.c - b.c}; }
constexpr Line operator+(Line a, std::int64_t v) noexcept { return {a.k, a.c + v}; }
constexpr Line constant(std::int64_t v) noexcept { return {0, v}; }

inline constexpr std::int64_t kBelow = -(std::int64_t{1} << 62);  // an unbounded begin
inline constexpr std::int64_t kAbove = std::int64_t{1} << 62;     // an unbounded end
inline constexpr std::int64_t kBound = std::int64_t{1} << 40;     // lengths, offsets, windows, positions

// A [batches, length] table as runs of equal values: run i is positions [start[i],
// end[i]) of batch batch[i], holding value[i], sorted by batch and start and tiling each
// batch's positions (a positions table's value is position - index: constant along a
// document, whose positions rise by one a token).
struct TableRuns {
  std::int64_t batches = 0, length = 0;
  std::vector<std::int64_t> batch, start, end, value;
  std::vector<std::int64_t> first_run;  // index(): batch b's runs are [first_run[b], first_run[b + 1])

  // Checks the runs tile every batch in order and indexes them by batch.
  [[nodiscard]] Status index() {
    const std::size_t n = batch.size();
    if (start.size() != n || end.size() != n || value.size() != n || batches < 0 || length < 0)
      return error(ErrorCode::invalid_shape, "table runs: columns of different lengths or a negative shape");
    first_run.assign(static_cast<std::size_t>(batches) + 1, 0);
    std::size_t i = 0;
    for (std::int64_t b = 0; b < batches; ++b) {
      first_run[static_cast<std::size_t>(b)] = static_cast<std::int64_t>(i);
      std::int64_t at = 0;
      for (; i < n && batch[i] == b && length > 0; ++i) {
        if (start[i] != at || end[i] <= start[i] || end[i] > length)
          return error(ErrorCode::invalid_argument, "table runs of batch " + std::to_string(b) +
                                                        " do not tile its positions in order");
        at = end[i];
      }
      if (at != length)
        return error(ErrorCode::invalid_argument, "table runs of batch " + std::to_string(b) + " end at " +
                                                      std::to_string(at) + ", not at " + std::to_string(length));
    }
    if (i != n) return error(ErrorCode::invalid_argument, "table runs past the last batch");
    first_run[static_cast<std::size_t>(batches)] = static_cast<std::int64_t>(n);
    return {};
  }

  // The run holding position x (0 <= x < length) of batch b.
  [[nodiscard]] std::int64_t find(std::int64_t b, std::int64_t x) const noexcept {
    const auto lo = start.begin() + first_run[static_cast<std::size_t>(b)];
    const auto hi = start.begin() + first_run[static_cast<std::size_t>(b) + 1];
    const std::ptrdiff_t after = std::upper_bound(lo, hi, x) - start.begin();
    return after - 1;
  }
};

// The rules (transformers.masking_utils' primitives), each row's keys [begin, end) in
// key indices, for a query value qv and a key value kv = index + shift:
enum class Rule : std::uint8_t {
  causal,                 // kv <= qv
  bidirectional,          // every key, for qv >= 0
  sliding,                // kv > qv - a (the window)
  sliding_bidirectional,  // |qv - kv| <= a
  chunked,                // the chunk of size a (from the batch's left padding, lists[table]) holding qv
  padding,                // keys whose padding value (tables[table]) is non-zero, one range a batch
  packed,                 // keys of the document (tables[table]) holding qv
  blocks,                 // keys of the block (tables[table]) holding qv where its id >= 0, else none
  all_of,                 // AND of the children
  any_of,                 // OR of the children (their ranges must meet)
  offsets,                // the child with qv + a and kv + b
  remap,                  // the child on positions (tables[table], a positions table) inside the
                          // document of the packed documents tables[scope]
};

struct Node {
  Rule rule = Rule::causal;
  std::int64_t a = 0, b = 0;
  int table = -1, scope = -1;
  std::vector<Node> children;
};

struct Definition {
  Node root;
  std::vector<TableRuns> tables;               // indexed (TableRuns::index) before evaluate()
  std::vector<std::vector<std::int64_t>> lists;  // per-batch values (chunked's left padding)
};

// Rows [lo, hi) of batch `batch`: keys [begin.at(q), end.at(q)) for each row q.
struct Piece {
  std::int64_t batch = 0, lo = 0, hi = 0;
  Line begin, end;
};

// Where evaluation starts: rows [lo, hi) of a batch with their query value and shift.
struct Start {
  std::int64_t batch = 0, lo = 0, hi = 0;
  Line qv, shift;
};

namespace detail {

constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
  const std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// The row in (lo, hi) from which f >= g changes (once at most: both are linear), or hi.
constexpr std::int64_t flip(Line f, Line g, std::int64_t lo, std::int64_t hi) noexcept {
  const std::int64_t dk = f.k - g.k;
  if (dk == 0) return hi;  // parallel (two unbounded ends among them: their difference would overflow)
  const std::int64_t dc = f.c - g.c;  // a sloped line is a row and a bounded value: no overflow
  std::int64_t q = hi;
  if (dk > 0) q = -floor_div(dc, dk);              // f >= g from ceil(-dc / dk)
  else if (dk < 0) q = floor_div(dc, -dk) + 1;    // f < g past dc / -dk
  return q > lo && q < hi ? q : hi;
}

// part(l, h) for each part of [lo, hi) over which every pair's comparison holds.
template <std::size_t N, class Part>
void for_each_part(std::int64_t lo, std::int64_t hi, const std::pair<Line, Line> (&pairs)[N], Part&& part) {
  std::int64_t cuts[N];
  for (std::size_t i = 0; i < N; ++i) cuts[i] = flip(pairs[i].first, pairs[i].second, lo, hi);
  std::sort(cuts, cuts + N);
  std::int64_t at = lo;
  for (std::int64_t cut : cuts) {
    if (cut > at && cut < hi) {
      part(at, cut);
      at = cut;
    }
  }
  part(at, hi);
}

class Evaluator {
 public:
  Evaluator(const Definition& d, std::int64_t batches) : d_(d), batches_(batches) {}

  // The tables' own checks, once each, in the tree's order; parameters beyond kBound
  // (which keeps every sum of ends and rows far from overflow) are refused.
  Status check(const Node& n) const {
    if (n.a < -kBound || n.a > kBound || n.b < -kBound || n.b > kBound)
      return unreadable("a parameter of " + std::to_string(n.a) + ", " + std::to_string(n.b) + " is past 2^40");
    if ((n.rule == Rule::offsets || n.rule == Rule::remap) && n.children.size() != 1)
      return error(ErrorCode::invalid_argument, "offsets and remap take one child");
    switch (n.rule) {
      case Rule::padding: case Rule::packed: case Rule::blocks: case Rule::remap: {
        const char* what = name_of(n.rule);
        const TableRuns* t = table(n.table);
        if (t == nullptr) return error(ErrorCode::invalid_argument, std::string(what) + ": no such table");
        if (t->batches < batches_)
          return unreadable(std::string(what) + " has " + std::to_string(t->batches) + " batch rows");
        if (t->length == 0) return unreadable(std::string(what) + " is empty");
        if (Status s = check_values(n, *t); !s.ok()) return s;
        break;
      }
      case Rule::chunked:
        if (n.a < 1) return unreadable("chunk_size " + std::to_string(n.a));
        if (n.table < 0 || static_cast<std::size_t>(n.table) >= d_.lists.size())
          return error(ErrorCode::invalid_argument, "chunked_overlay: no left_padding list");
        if (static_cast<std::int64_t>(d_.lists[static_cast<std::size_t>(n.table)].size()) < batches_)
          return unreadable("left_padding has " + std::to_string(d_.lists[static_cast<std::size_t>(n.table)].size()) +
                            " batch rows");
        for (std::int64_t v : d_.lists[static_cast<std::size_t>(n.table)])
          if (v < -kBound || v > kBound) return unreadable("a left_padding of " + std::to_string(v) + " is past 2^40");
        break;
      case Rule::all_of: case Rule::any_of:
        if (n.children.empty()) return unreadable("a join of no mask functions");
        break;
      default: break;
    }
    for (const Node& child : n.children)
      if (Status s = check(child); !s.ok()) return s;
    return {};
  }

  // Appends the pieces of rows [lo, hi) of batch b under n; false (failed() says why) on
  // a value that is not one interval a row.
  bool eval(const Node& n, std::int64_t b, std::int64_t lo, std::int64_t hi, Line qv, Line shift,
            std::vector<Piece>& out) {
    const auto push = [&](std::int64_t l, std::int64_t h, Line begin, Line end) { out.push_back({b, l, h, begin, end}); };
    switch (n.rule) {
      case Rule::causal: push(lo, hi, constant(kBelow), qv - shift + 1); return true;
      case Rule::bidirectional:
        for_each_part(lo, hi, {std::pair{qv, constant(0)}}, [&](std::int64_t l, std::int64_t h) {
          push(l, h, constant(kBelow), constant(qv.at(l) >= 0 ? kAbove : kBelow));
        });
        return true;
      case Rule::sliding: push(lo, hi, qv - shift + (1 - n.a), constant(kAbove)); return true;
      case Rule::sliding_bidirectional: push(lo, hi, qv - shift + (-n.a), qv - shift + (n.a + 1)); return true;
      case Rule::chunked: {
        if (!rising(qv, "chunked_overlay's query")) return false;
        const std::int64_t origin = d_.lists[static_cast<std::size_t>(n.table)][static_cast<std::size_t>(b)];
        for (std::int64_t q = lo; q < hi;) {
          const std::int64_t first = origin + floor_div(qv.at(q) - origin, n.a) * n.a;
          const std::int64_t next = qv.k == 0 ? hi : std::min(hi, q + first + n.a - qv.at(q));
          const Line begin = constant(first) - shift;
          push(q, next, begin, begin + n.a);
          q = next;
        }
        return true;
      }
      case Rule::padding: {
        const TableRuns& t = *table(n.table);
        std::int64_t first = 0, last = 0;
        for (std::int64_t r = t.first_run[static_cast<std::size_t>(b)]; r < t.first_run[static_cast<std::size_t>(b) + 1];
             ++r)
          if (t.value[static_cast<std::size_t>(r)] != 0)
            first = t.start[static_cast<std::size_t>(r)], last = t.end[static_cast<std::size_t>(r)];
        push(lo, hi, constant(first) - shift, constant(last) - shift);
        return true;
      }
      case Rule::packed: case Rule::blocks: {
        const TableRuns& t = *table(n.table);
        return for_each_run(t, name_of(n.rule), b, lo, hi, qv, [&](std::int64_t l, std::int64_t h, std::size_t r) {
          const bool inside = n.rule == Rule::packed || t.value[r] >= 0;
          push(l, h, inside ? constant(t.start[r]) - shift : constant(kAbove),
               inside ? constant(t.end[r]) - shift : constant(kBelow));
        });
      }
      case Rule::offsets: return eval(n.children[0], b, lo, hi, qv + n.a, shift + n.b, out);
      case Rule::remap: {
        const TableRuns& t = *table(n.table);
        bool ok = true;
        const bool walked = for_each_run(t, "position_ids", b, lo, hi, qv, [&](std::int64_t l, std::int64_t h,
                                                                               std::size_t r) {
          // Along the document the key at index j has position j + value: the child sees
          // positions, and the rows stay inside the document.
          const Line to_position = constant(t.value[r]);
          const Line doc_begin = constant(t.start[r]) - shift, doc_end = constant(t.end[r]) - shift;
          std::vector<Piece> inner;
          ok = ok && eval(n.children[0], b, l, h, qv + to_position, shift + to_position, inner);
          for (const Piece& p : inner) intersect(p, doc_begin, doc_end, out);
        });
        return walked && ok;
      }
      case Rule::all_of: case Rule::any_of: return join(n, b, lo, hi, qv, shift, out);
    }
    return fail(error(ErrorCode::invalid_argument, "an unknown rule"));
  }

  [[nodiscard]] const Status& failed() const noexcept { return failed_; }

 private:
  static const char* name_of(Rule r) noexcept {
    switch (r) {
      case Rule::padding: return "padding_mask";
      case Rule::packed: return "packed_sequence_mask";
      case Rule::blocks: return "block_sequence_ids";
      case Rule::remap: return "position_ids";
      default: return "a rule";
    }
  }
  static Status unreadable(std::string why) { return error(ErrorCode::invalid_value, std::move(why)); }

  const TableRuns* table(int i) const noexcept {
    return i >= 0 && static_cast<std::size_t>(i) < d_.tables.size() ? &d_.tables[static_cast<std::size_t>(i)] : nullptr;
  }

  Status check_values(const Node& n, const TableRuns& t) const {
    const auto runs_of = [&](std::int64_t b) {
      return std::pair{t.first_run[static_cast<std::size_t>(b)], t.first_run[static_cast<std::size_t>(b) + 1]};
    };
    for (std::int64_t b = 0; b < t.batches; ++b) {
      const auto [r0, r1] = runs_of(b);
      if (n.rule == Rule::padding) {
        int valid = 0;
        for (std::int64_t r = r0; r < r1; ++r) valid += t.value[static_cast<std::size_t>(r)] != 0;
        if (valid > 1) return unreadable("padding_mask with holes (a batch's valid keys are not one range)");
      } else if (n.rule == Rule::packed || n.rule == Rule::blocks) {
        std::vector<std::int64_t> ids;
        for (std::int64_t r = r0; r < r1; ++r)
          if (n.rule == Rule::packed || t.value[static_cast<std::size_t>(r)] >= 0)
            ids.push_back(t.value[static_cast<std::size_t>(r)]);
        std::sort(ids.begin(), ids.end());
        if (std::adjacent_find(ids.begin(), ids.end()) != ids.end())
          return unreadable(std::string(name_of(n.rule)) +
                            ": a value appears in two separate runs (its rows attend two key ranges)");
      }
    }
    if (n.rule != Rule::remap) return {};
    // The documents of the positions (a new one wherever a position is not its
    // predecessor's + 1: runs of position - index) are the packed documents', numbered
    // from the batch's first.
    const TableRuns* scope = table(n.scope);
    bool same = scope != nullptr && scope->batches == t.batches && scope->length == t.length &&
                scope->start == t.start && scope->batch == t.batch;
    for (std::int64_t b = 0; same && b < t.batches; ++b) {
      const auto [r0, r1] = runs_of(b);
      for (std::int64_t r = r0; r < r1; ++r)
        same = same && scope->value[static_cast<std::size_t>(r)] - scope->value[static_cast<std::size_t>(r0)] == r - r0;
    }
    if (!same) return unreadable("position_ids whose documents are not the packed_sequence_mask's");
    for (std::size_t r = 0; r < t.start.size(); ++r) {  // a document's first position is its least
      if (t.value[r] < -kBound || t.value[r] > kBound)
        return unreadable("a position of " + std::to_string(t.value[r]) + " is past 2^40 from its index");
      if (t.value[r] + t.start[r] < 0) return unreadable("negative position_ids");
    }
    return {};
  }

  bool fail(Status s) {
    if (failed_.ok()) failed_ = std::move(s);
    return false;
  }

  bool rising(Line x, const char* what) {
    return x.k == 0 || x.k == 1 ||
           fail(unreadable(std::string(what) + " does not rise by 0 or 1 a row"));
  }

  // visit(l, h, run) for each part of rows [lo, hi) over which x stays in one run of t.
  template <class Visit>
  bool for_each_run(const TableRuns& t, const char* what, std::int64_t b, std::int64_t lo, std::int64_t hi, Line x,
                    Visit&& visit) {
    if (!rising(x, what)) return false;
    if (x.at(lo) < 0 || x.at(hi - 1) >= t.length)
      return fail(unreadable(std::string(what) + " of length " + std::to_string(t.length) + " is indexed outside it"));
    auto r = static_cast<std::size_t>(t.find(b, x.at(lo)));
    for (std::int64_t q = lo; q < hi; ++r) {
      const std::int64_t next = x.k == 0 ? hi : std::min(hi, q + t.end[r] - x.at(q));
      visit(q, next, r);
      q = next;
    }
    return true;
  }

  // p's rows restricted to keys [doc_begin, doc_end).
  static void intersect(const Piece& p, Line doc_begin, Line doc_end, std::vector<Piece>& out) {
    const std::pair<Line, Line> pairs[] = {{p.begin, doc_begin}, {p.end, doc_end}};
    for_each_part(p.lo, p.hi, pairs, [&](std::int64_t l, std::int64_t h) {
      out.push_back({p.batch, l, h, p.begin.at(l) >= doc_begin.at(l) ? p.begin : doc_begin,
                     p.end.at(l) >= doc_end.at(l) ? doc_end : p.end});
    });
  }

  bool join(const Node& n, std::int64_t b, std::int64_t lo, std::int64_t hi, Line qv, Line shift,
            std::vector<Piece>& out) {
    if (n.rule == Rule::any_of) return join_any(n, b, lo, hi, qv, shift, out);
    // AND starts from every key and intersects each child in turn.
    std::vector<Piece> now{{b, lo, hi, constant(kBelow), constant(kAbove)}}, next, part;
    for (const Node& child : n.children) {
      next.clear();
      for (const Piece& p : now) {
        part.clear();
        if (!eval(child, b, p.lo, p.hi, qv, shift, part)) return false;
        for (const Piece& c : part) {
          const std::pair<Line, Line> pairs[] = {{p.begin, c.begin}, {p.end, c.end}};
          for_each_part(c.lo, c.hi, pairs, [&](std::int64_t l, std::int64_t h) {
            next.push_back({b, l, h, p.begin.at(l) >= c.begin.at(l) ? p.begin : c.begin,
                            p.end.at(l) >= c.end.at(l) ? c.end : p.end});
          });
        }
      }
      std::swap(now, next);
    }
    out.insert(out.end(), now.begin(), now.end());
    return true;
  }

  // An OR's operands: its children, with those of a child OR in their place (an OR of ORs
  // is one OR of all their children, so neither the order nor the grouping decides).
  static void operands(const Node& n, std::vector<const Node*>& out) {
    for (const Node& child : n.children) {
      if (child.rule == Rule::any_of) operands(child, out);
      else out.push_back(&child);
    }
  }

  // OR of all the operands at once: each one's pieces over [lo, hi) (each covers the rows
  // in order), then each run of rows where every operand is one piece is cut where a
  // range turns empty (begin against its end), two begins or two ends swap order, or a
  // begin passes another's end (begin against end + 1). Over each part the non-empty
  // ranges, sorted by begin, join into one range exactly when each begins at or before the
  // furthest end before it; a row where one begins past it attends two key ranges and is
  // refused. Neighbouring parts with the same lines are one piece.
  bool join_any(const Node& n, std::int64_t b, std::int64_t lo, std::int64_t hi, Line qv, Line shift,
                std::vector<Piece>& out) {
    std::vector<const Node*> nodes;
    operands(n, nodes);
    const std::size_t count = nodes.size();
    if (count == 0) return fail(unreadable("a join of no mask functions"));
    std::vector<std::vector<Piece>> parts(count);
    for (std::size_t i = 0; i < count; ++i)
      if (!eval(*nodes[i], b, lo, hi, qv, shift, parts[i])) return false;
    const std::size_t first_out = out.size();
    std::vector<std::size_t> at(count, 0), order;
    std::vector<const Piece*> now(count);
    std::vector<std::int64_t> cuts;
    for (std::int64_t q = lo; q < hi;) {
      std::int64_t run_end = hi;
      for (std::size_t i = 0; i < count; ++i) {
        while (at[i] < parts[i].size() && parts[i][at[i]].hi <= q) ++at[i];
        if (at[i] == parts[i].size() || parts[i][at[i]].lo > q)
          return fail(error(ErrorCode::invalid_argument, "or_masks: a child left rows without a range"));
        now[i] = &parts[i][at[i]];
        run_end = std::min(run_end, now[i]->hi);
      }
      cuts.clear();
      for (std::size_t i = 0; i < count; ++i) {
        cuts.push_back(flip(now[i]->begin, now[i]->end, q, run_end));
        for (std::size_t j = i + 1; j < count; ++j) {
          cuts.push_back(flip(now[i]->begin, now[j]->begin, q, run_end));
          cuts.push_back(flip(now[i]->end, now[j]->end, q, run_end));
          cuts.push_back(flip(now[i]->begin, now[j]->end + 1, q, run_end));
          cuts.push_back(flip(now[j]->begin, now[i]->end + 1, q, run_end));
        }
      }
      cuts.push_back(run_end);
      std::sort(cuts.begin(), cuts.end());
      std::int64_t l = q;
      for (std::int64_t cut : cuts) {
        if (cut <= l) continue;
        order.clear();
        for (std::size_t i = 0; i < count; ++i)
          if (now[i]->begin.at(l) < now[i]->end.at(l)) order.push_back(i);
        // Ties at row l broken as the cuts' comparisons (f >= g, pair (earlier, later)) hold
        // over the whole part: the later child's begin is the least, the earlier's end the
        // greatest.
        std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
          const std::int64_t bx = now[x]->begin.at(l), by = now[y]->begin.at(l);
          return bx < by || (bx == by && x > y);
        });
        Line begin = constant(kAbove), end = constant(kBelow);  // no range: the row attends nothing
        std::size_t furthest = count;
        for (std::size_t i : order) {
          if (furthest == count) {
            begin = now[i]->begin, end = now[i]->end, furthest = i;
            continue;
          }
          if (now[i]->begin.at(l) > end.at(l))
            return fail(unreadable("or_masks: a row attends two separate key ranges"));
          const std::int64_t e = now[i]->end.at(l);
          if (e > end.at(l) || (e == end.at(l) && i < furthest)) end = now[i]->end, furthest = i;
        }
        Piece* last = out.size() > first_out ? &out.back() : nullptr;
        if (last != nullptr && last->hi == l && last->begin == begin && last->end == end) last->hi = cut;
        else out.push_back({b, l, cut, begin, end});
        l = cut;
      }
      q = run_end;
    }
    return true;
  }

  const Definition& d_;
  std::int64_t batches_;
  Status failed_;
};

// Clipped to keys [0, k_len), an empty row made (0, 0).
inline void clip(const Piece& p, std::int64_t k_len, std::vector<Piece>& out) {
  const Line zero = constant(0), keys = constant(k_len);
  const std::pair<Line, Line> bounds[] = {{p.begin, zero}, {p.begin, keys}, {p.end, zero}, {p.end, keys}};
  for_each_part(p.lo, p.hi, bounds, [&](std::int64_t l, std::int64_t h) {
    const auto clamp = [&](Line x) { return x.at(l) >= k_len ? keys : (x.at(l) >= 0 ? x : zero); };
    const Line begin = clamp(p.begin), end = clamp(p.end);
    const std::pair<Line, Line> order[] = {{begin, end}};
    for_each_part(l, h, order, [&](std::int64_t l2, std::int64_t h2) {
      const bool empty = begin.at(l2) >= end.at(l2);
      out.push_back({p.batch, l2, h2, empty ? zero : begin, empty ? zero : end});
    });
  });
}

// Whether two batches' pieces (each tiling the same rows in order) give every row the same keys.
inline bool same_rows(const Piece* x, const Piece* x_end, const Piece* y, const Piece* y_end) {
  std::int64_t q = x == x_end ? 0 : x->lo;
  while (x != x_end && y != y_end) {
    const std::int64_t hi = std::min(x->hi, y->hi);
    if (x->begin.at(q) != y->begin.at(q) || x->end.at(q) != y->end.at(q)) return false;
    if (hi - q > 1 && (x->begin.k != y->begin.k || x->end.k != y->end.k)) return false;
    q = hi;
    if (x->hi == hi) ++x;
    if (y->hi == hi) ++y;
  }
  return x == x_end && y == y_end;
}

}  // namespace detail

// The pieces of the definition's rows from `starts` (each batch's rows in order), with
// keys clipped to [0, k_len) where k_len >= 0 (the raw ends otherwise). The tables must
// be indexed (TableRuns::index).
inline Result<std::vector<Piece>> evaluate(const Definition& d, std::int64_t batches, const std::vector<Start>& starts,
                                           std::int64_t k_len) {
  return catch_alloc([&]() -> Result<std::vector<Piece>> {
    detail::Evaluator e(d, batches);
    if (Status s = e.check(d.root); !s.ok()) return s;
    std::vector<Piece> raw, out;
    const auto bounded = [](std::int64_t v) { return v >= -kBound && v <= kBound; };
    for (const Start& s : starts) {
      if (s.batch < 0 || s.batch >= batches || s.lo >= s.hi)
        return error(ErrorCode::invalid_argument, "a start outside the batches or of no rows");
      if (!bounded(s.lo) || !bounded(s.hi) || !bounded(s.qv.k) || !bounded(s.qv.c) || !bounded(s.shift.k) ||
          !bounded(s.shift.c))
        return error(ErrorCode::invalid_argument, "a start's rows or lines are past 2^40");
      // A slope past 1 would let a row times a slope (rows up to 2^40) overflow in a rule
      // that reads no table (those check their query's slope themselves).
      if (s.qv.k < -1 || s.qv.k > 1 || s.shift.k < -1 || s.shift.k > 1)
        return error(ErrorCode::invalid_argument, "a start's query value or key shift rises by more than 1 a row");
      if (!e.eval(d.root, s.batch, s.lo, s.hi, s.qv, s.shift, raw)) return e.failed();
    }
    if (k_len < 0) return raw;
    out.reserve(raw.size());
    for (const Piece& p : raw) detail::clip(p, k_len, out);
    return out;
  });
}

// The rows of a [batches, 1, q_len, k_len] mask: query value q + q_offset, key value
// k + kv_offset.
inline Result<std::vector<Piece>> rows(const Definition& d, std::int64_t batches, std::int64_t q_len,
                                       std::int64_t k_len, std::int64_t q_offset, std::int64_t kv_offset) {
  if (batches < 1 || q_len < 1 || k_len < 1 || q_offset < 0 || kv_offset < 0)
    return error(ErrorCode::invalid_shape, "a definition's rows need batches, q_len, k_len >= 1 and offsets >= 0");
  if (q_len > kBound || k_len > kBound || q_offset > kBound || kv_offset > kBound)
    return error(ErrorCode::invalid_shape, "a definition's lengths and offsets must be at most 2^40");
  std::vector<Start> starts;
  for (std::int64_t b = 0; b < batches; ++b) starts.push_back({b, 0, q_len, {1, q_offset}, constant(kv_offset)});
  return evaluate(d, batches, starts, k_len);
}

// The pieces (rows() of a [batches, 1, q_len, k_len] mask) as span runs: one table for
// every batch when every batch's rows are the first's (as a scan finds them).
inline SpanRuns span_runs(const std::vector<Piece>& pieces, std::int64_t batches, std::int64_t q_len,
                          std::int64_t k_len) {
  const auto batch_end = [&](std::size_t from) {
    std::size_t i = from;
    while (i < pieces.size() && pieces[i].batch == pieces[from].batch) ++i;
    return i;
  };
  const std::size_t first_end = batch_end(0);
  bool alike = batches > 1;
  for (std::size_t i = first_end; alike && i < pieces.size();) {
    const std::size_t e = batch_end(i);
    alike = detail::same_rows(pieces.data(), pieces.data() + first_end, pieces.data() + i, pieces.data() + e);
    i = e;
  }
  SpanRuns runs;
  runs.batch = batches, runs.heads = 1, runs.q_len = q_len, runs.k_len = k_len;
  runs.distinct_batch = alike ? 1 : batches, runs.distinct_heads = 1;
  const std::size_t n = alike ? first_end : pieces.size();
  runs.runs.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Piece& p = pieces[i];
    const std::int64_t first = p.begin.at(p.lo), last = p.end.at(p.lo) - 1;
    const bool empty = first > last, stepping = p.hi - p.lo > 1 && !empty;
    SpanRun r;
    r.row = p.batch * q_len + p.lo, r.length = p.hi - p.lo;
    r.first = empty ? RowSpan::kNoKey : first, r.last = empty ? -1 : last;
    r.d_first = stepping ? p.begin.k : 0, r.d_last = stepping ? p.end.k : 0;
    r.count = empty ? 0 : last - first + 1;
    runs.runs.push_back(r);
  }
  return runs;
}

}  // namespace masklens::definition
