// Tile summaries: the host scanner against a tile-by-tile count of the elements, the
// spans it returns against scan(), tiles derived from a structure against the scanned
// tiles of its mask for every kind, broadcast dimensions, torch's BlockMask layout, bad
// input, and decide() charging FlexAttention on tiles.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "support/calls.hpp"
#include "support/mask_gen.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

// Tile (qt, kt) of logical slice (b, h) straight from the elements: every element of the
// tile inside the mask is read; a tile cut short by Q or K is never full (torch pads
// with masked elements).
TileState reference_state(const MaskView& v, TileSize size, std::int64_t b, std::int64_t h, std::int64_t qt,
                          std::int64_t kt) {
  const std::int64_t q0 = qt * size.q, q1 = std::min(v.q_len(), q0 + size.q);
  const std::int64_t k0 = kt * size.k, k1 = std::min(v.k_len(), k0 + size.k);
  std::int64_t attending = 0;
  for (std::int64_t q = q0; q < q1; ++q)
    for (std::int64_t k = k0; k < k1; ++k) attending += attends(v.at(b, h, q, k)) ? 1 : 0;
  if (attending == 0) return TileState::empty;
  return attending == size.q * size.k ? TileState::full : TileState::partial;
}

std::int64_t tiles_of(std::int64_t n, std::int64_t size) { return (n + size - 1) / size; }

// Every logical tile of the summary equals the reference.
void check_summary(const MaskView& v, TileSize size, const TileSummary& t, const std::string& what) {
  REQUIRE(t.grid.q_tiles() == tiles_of(v.q_len(), size.q));
  REQUIRE(t.grid.k_tiles() == tiles_of(v.k_len(), size.k));
  REQUIRE(t.states.size() == static_cast<std::size_t>(t.grid.tiles()));
  for (std::int64_t b = 0; b < v.batch(); ++b)
    for (std::int64_t h = 0; h < v.heads(); ++h)
      for (std::int64_t qt = 0; qt < t.grid.q_tiles(); ++qt)
        for (std::int64_t kt = 0; kt < t.grid.k_tiles(); ++kt) {
          const TileState want = reference_state(v, size, b, h, qt, kt);
          if (t.state_at(b, h, qt, kt) != want) {
            FAIL_CHECK(what << ": tile [" << b << ", " << h << ", " << qt << ", " << kt << "] is "
                            << static_cast<int>(t.state_at(b, h, qt, kt)) << ", want " << static_cast<int>(want));
            return;
          }
        }
}

// One row of torch's _dense_to_ordered, written as torch does it: a stable descending
// argsort of the 0/1 row (not the writers' two loops).
std::vector<std::int32_t> ordered(const std::vector<int>& marks) {
  std::vector<std::int32_t> idx(marks.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::int32_t a, std::int32_t b) {
    return marks[static_cast<std::size_t>(a)] > marks[static_cast<std::size_t>(b)];
  });
  return idx;
}

// The BlockMask tensors of a summary against the states they come from.
void check_block_mask(const TileSummary& s, const BlockMaskTensors& t) {
  const TileGrid& g = s.grid;
  const std::int64_t nq = g.q_tiles(), nk = g.k_tiles();
  for (BlockMaskField f : kBlockMaskFields) {
    const Int32Tensor x = t.tensor(f);
    CHECK(x.shape[0] == g.distinct_batch);
    CHECK(x.shape[1] == g.distinct_heads);
    CHECK(x.numel() == static_cast<std::int64_t>(t.values(f).size()));
  }
  for (std::int64_t slice = 0; slice < g.slices(); ++slice)
    for (TileState want : {TileState::partial, TileState::full}) {
      const bool full = want == TileState::full;
      const auto& kv_count = full ? t.full_kv_num_blocks : t.kv_num_blocks;
      const auto& kv_index = full ? t.full_kv_indices : t.kv_indices;
      const auto& q_count = full ? t.full_q_num_blocks : t.q_num_blocks;
      const auto& q_index = full ? t.full_q_indices : t.q_indices;
      for (std::int64_t qt = 0; qt < nq; ++qt) {
        std::vector<int> marks;
        for (std::int64_t kt = 0; kt < nk; ++kt) marks.push_back(s.state(slice, qt, kt) == want ? 1 : 0);
        const auto row = static_cast<std::size_t>(slice * nq + qt);
        CHECK(kv_count[row] == std::accumulate(marks.begin(), marks.end(), 0));
        const std::vector<std::int32_t> want_idx = ordered(marks);
        CHECK(std::equal(want_idx.begin(), want_idx.end(), kv_index.begin() + static_cast<std::ptrdiff_t>(row * static_cast<std::size_t>(nk))));
      }
      for (std::int64_t kt = 0; kt < nk; ++kt) {
        std::vector<int> marks;
        for (std::int64_t qt = 0; qt < nq; ++qt) marks.push_back(s.state(slice, qt, kt) == want ? 1 : 0);
        const auto column = static_cast<std::size_t>(slice * nk + kt);
        CHECK(q_count[column] == std::accumulate(marks.begin(), marks.end(), 0));
        const std::vector<std::int32_t> want_idx = ordered(marks);
        CHECK(std::equal(want_idx.begin(), want_idx.end(), q_index.begin() + static_cast<std::ptrdiff_t>(column * static_cast<std::size_t>(nq))));
      }
    }
}

// A mask in memory with arbitrary contents: attend[pb][ph][q][k] stored in `dtype` in one
// of four layouts (contiguous, keys strided with junk between, Fortran order, and one
// stored slice broadcast over batch and heads through stride 0).
struct Stored {
  std::vector<std::uint64_t> storage;
  MaskView view;
};

enum class Place { contiguous, strided_keys, fortran, broadcast };

Stored store(const std::vector<std::uint8_t>& attend, std::int64_t pb, std::int64_t ph, std::int64_t Q, std::int64_t K,
             ElementType dtype, Polarity pol, Place place, std::int64_t B, std::int64_t H, Rng& rng) {
  Stored out;
  const int esize = element_size(dtype);
  const std::int64_t kstep = place == Place::strided_keys ? 2 : 1, pk = K * kstep;
  std::array<std::int64_t, 4> strides{ph * Q * pk, Q * pk, pk, kstep};
  if (place == Place::fortran) strides = {1, pb, pb * ph, pb * ph * Q};
  const std::int64_t elements = pb * ph * Q * pk + 8;
  out.storage.assign(static_cast<std::size_t>((elements * esize + 7) / 8), 0);
  auto* base = reinterpret_cast<std::uint8_t*>(out.storage.data());
  // Junk that attends between strided keys: read by mistake, it would show.
  for (std::int64_t i = 0; i < elements; ++i) write_value(base + i * esize, dtype, pol, Value::allowed, 0);
  for (std::int64_t b = 0; b < pb; ++b)
    for (std::int64_t h = 0; h < ph; ++h)
      for (std::int64_t q = 0; q < Q; ++q)
        for (std::int64_t k = 0; k < K; ++k) {
          const bool a = attend[static_cast<std::size_t>(((b * ph + h) * Q + q) * K + k)] != 0;
          const Value v = a ? (is_additive(dtype) && coin(rng, 0.1) ? Value::bias : Value::allowed) : Value::masked;
          const std::int64_t o = b * strides[0] + h * strides[1] + q * strides[2] + k * strides[3];
          write_value(base + o * esize, dtype, pol, v, static_cast<int>(uniform(rng, 0, 5)));
        }
  const std::int64_t shape[4] = {pb, ph, Q, K};
  MaskEncoding enc;
  enc.polarity = is_additive(dtype) ? Polarity::true_attends : pol;
  auto view = MaskView::make(base, dtype, shape, strides, enc);
  REQUIRE(view.ok());
  if (place == Place::broadcast) view = view->broadcast_to(B, H);
  REQUIRE(view.ok());
  out.view = *view;
  return out;
}

// Block-structured contents with blocks that do not line up with the tiles: each block
// empty, full, or random at some density, so every tile state and ragged edges occur.
std::vector<std::uint8_t> block_contents(Rng& rng, std::int64_t slices, std::int64_t Q, std::int64_t K) {
  std::vector<std::uint8_t> a(static_cast<std::size_t>(slices * Q * K));
  for (std::int64_t s = 0; s < slices; ++s) {
    const std::int64_t bq = uniform(rng, 1, 12), bk = uniform(rng, 1, 12);
    for (std::int64_t q0 = 0; q0 < Q; q0 += bq)
      for (std::int64_t k0 = 0; k0 < K; k0 += bk) {
        const std::int64_t mode = uniform(rng, 0, 3);
        const double density = mode == 2 ? 0.5 : 0.97;
        for (std::int64_t q = q0; q < std::min(Q, q0 + bq); ++q)
          for (std::int64_t k = k0; k < std::min(K, k0 + bk); ++k)
            a[static_cast<std::size_t>((s * Q + q) * K + k)] =
                mode == 0 ? 0 : mode == 1 ? 1 : static_cast<std::uint8_t>(coin(rng, density));
      }
  }
  return a;
}

constexpr ElementType kTypes[] = {ElementType::boolean, ElementType::uint8, ElementType::int8,
                                  ElementType::float16, ElementType::bfloat16, ElementType::float32};

}  // namespace

TEST_SUITE("host") {

TEST_CASE("tiles of random block-structured masks with ragged tiles equal a tile-by-tile count") {
  Rng rng(test_seed(14));
  int summaries = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const std::int64_t B = uniform(rng, 1, 2), H = uniform(rng, 1, 3), Q = uniform(rng, 1, 40), K = uniform(rng, 1, 70);
    const TileSize size{uniform(rng, 1, 16), uniform(rng, 1, 24)};
    const ElementType dtype = kTypes[uniform(rng, 0, 5)];
    const Polarity pol = !is_additive(dtype) && coin(rng, 0.3) ? Polarity::true_masks : Polarity::true_attends;
    const auto place = static_cast<Place>(uniform(rng, 0, 3));
    const std::int64_t pb = place == Place::broadcast ? 1 : B, ph = place == Place::broadcast ? 1 : H;
    const Stored m = store(block_contents(rng, pb * ph, Q, K), pb, ph, Q, K, dtype, pol, place, B, H, rng);
    const int threads = static_cast<int>(uniform(rng, 1, 3));
    const std::string what = std::string(to_string(dtype)) + " place " + std::to_string(static_cast<int>(place)) +
                             " [" + std::to_string(B) + "," + std::to_string(H) + "," + std::to_string(Q) + "," +
                             std::to_string(K) + "] tiles " + std::to_string(size.q) + "x" + std::to_string(size.k);
    auto both = scan_with_tiles(m.view, size, ScanOptions{threads});
    REQUIRE_MESSAGE(both.ok(), what << ": " << both.status().to_string());
    check_summary(m.view, size, both->tiles, what);
    // The spans of the same read are scan()'s, row for row.
    auto spans = scan(m.view);
    REQUIRE(spans.ok());
    REQUIRE(spans->rows.size() == both->spans.rows.size());
    for (std::size_t r = 0; r < spans->rows.size(); ++r) {
      const RowSpan& want = spans->rows[r];
      const RowSpan& got = both->spans.rows[r];
      if (!(want.same_keys(got) && want.flags == got.flags)) {
        FAIL_CHECK(what << ": row " << r << " first " << got.first << " last " << got.last << " count " << got.count
                        << " flags " << got.flags << ", scan() has " << want.first << " " << want.last << " "
                        << want.count << " " << want.flags);
        break;
      }
    }
    auto bm = block_mask_tensors(both->tiles);
    REQUIRE(bm.ok());
    check_block_mask(both->tiles, *bm);
    ++summaries;
  }
  MESSAGE("summaries compared: " << summaries);
}

TEST_CASE("tiles derived from a structure equal the scanned tiles of its mask, for every exact kind") {
  Rng rng(test_seed(1414));
  int per_kind[6] = {};
  int compared = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const std::int64_t B = uniform(rng, 1, 3), Q = uniform(rng, 1, 48);
    const std::int64_t K = coin(rng, 0.4) ? Q : uniform(rng, 1, 64);
    const auto layout = static_cast<Layout>(uniform(rng, 0, 3));
    // An expanded mask stores one slice: its structure is batch 0's, repeated.
    MaskStructure spec = layout == Layout::expand ? repeat_batches(random_structure(rng, 1, Q, K), B)
                                                  : random_structure(rng, B, Q, K);
    if (!spec.validate().ok()) continue;
    const std::int64_t H = uniform(rng, 1, 2);
    const TileSize size{uniform(rng, 1, 13), uniform(rng, 1, 13)};
    const ElementType dtype = coin(rng, 0.7) ? ElementType::boolean : kTypes[uniform(rng, 0, 5)];
    const DenseMask m = render(spec, H, dtype, Polarity::true_attends, layout, rng);
    auto scanned = scan_tiles(m.view, size);
    REQUIRE(scanned.ok());
    auto derived = tiles_from_structure(spec, size);
    REQUIRE_MESSAGE(derived.ok(), derived.status().to_string());
    CHECK(derived->grid.distinct_heads == 1);
    bool same = true;
    for (std::int64_t b = 0; b < B && same; ++b)
      for (std::int64_t h = 0; h < H && same; ++h)
        for (std::int64_t qt = 0; qt < derived->grid.q_tiles() && same; ++qt)
          for (std::int64_t kt = 0; kt < derived->grid.k_tiles() && same; ++kt)
            if (derived->state_at(b, h, qt, kt) != scanned->state_at(b, h, qt, kt)) {
              FAIL_CHECK(describe(spec) << " [" << B << "," << H << "," << Q << "," << K << "] tiles " << size.q << "x"
                                        << size.k << ": tile [" << b << "," << h << "," << qt << "," << kt << "] derived "
                                        << static_cast<int>(derived->state_at(b, h, qt, kt)) << ", scanned "
                                        << static_cast<int>(scanned->state_at(b, h, qt, kt)));
              same = false;
            }
    // decide()'s shares of the same tiles.
    const TileFractions shares = structure_tile_fractions(spec, size);
    const TileFractions counted = scanned->fractions();
    CHECK(shares.partial == doctest::Approx(counted.partial));
    CHECK(shares.full == doctest::Approx(counted.full));
    ++per_kind[static_cast<int>(spec.kind)];
    ++compared;
  }
  for (int k = 0; k < 6; ++k) CHECK_MESSAGE(per_kind[k] > 100, to_string(static_cast<StructureKind>(k)) << ": " << per_kind[k]);
  MESSAGE("structures compared: " << compared);
}

TEST_CASE("tiles from a structure at full size: windows, chunks, documents and padding at 128 x 128") {
  // Larger cases at torch's default tile, where most tiles are whole.
  const auto check = [](MaskStructure s) {
    REQUIRE(s.validate().ok());
    const DenseMask m = [&] {
      Rng rng(3);
      return render(s, 1, ElementType::boolean, Polarity::true_attends, Layout::contiguous, rng);
    }();
    auto scanned = scan_tiles(m.view);
    auto derived = tiles_from_structure(s);
    REQUIRE(scanned.ok());
    REQUIRE(derived.ok());
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t qt = 0; qt < derived->grid.q_tiles(); ++qt)
        for (std::int64_t kt = 0; kt < derived->grid.k_tiles(); ++kt)
          REQUIRE_MESSAGE(derived->state_at(b, 0, qt, kt) == scanned->state_at(b, 0, qt, kt),
                          describe(s) << " tile " << b << "," << qt << "," << kt);
  };
  auto window = make_structure(StructureKind::sliding_window, 1, 1000, 1000);
  window.window = 300;
  check(window);
  auto chunked = make_structure(StructureKind::chunked, 1, 700, 900, Alignment::bottom_right);
  chunked.chunk = 200;
  check(chunked);
  auto docs = make_structure(StructureKind::causal, 2, 640, 640);
  docs.segments = {{0, 100, 356, 640}, {0, 640}};
  docs.kv_valid = {{0, 600}, {50, 640}};
  check(docs);
  auto prefix = make_structure(StructureKind::prefix_lm, 1, 513, 513);
  prefix.prefix = 200;
  prefix.q_valid = {{0, 400}};
  check(prefix);
  auto blocks = make_structure(StructureKind::causal_blocks, 1, 768, 768);
  blocks.blocks = {{10, 300}, {400, 700}};
  check(blocks);
}

TEST_CASE("a stride-0 batch and head give one summary, broadcast") {
  Rng rng(21);
  const std::int64_t B = 3, H = 4, Q = 37, K = 53;
  const TileSize size{8, 16};
  const Stored m = store(block_contents(rng, 1, Q, K), 1, 1, Q, K, ElementType::boolean, Polarity::true_attends,
                         Place::broadcast, B, H, rng);
  REQUIRE(m.view.stride(kBatch) == 0);
  REQUIRE(m.view.stride(kHeads) == 0);
  auto t = scan_tiles(m.view, size);
  REQUIRE(t.ok());
  CHECK(t->grid.distinct_batch == 1);
  CHECK(t->grid.distinct_heads == 1);
  CHECK(t->states.size() == static_cast<std::size_t>(5 * 4));
  check_summary(m.view, size, *t, "broadcast");
  auto bm = block_mask_tensors(*t);
  REQUIRE(bm.ok());
  const Int32Tensor kv = bm->tensor(BlockMaskField::kv_indices);
  CHECK(kv.rank == 4);
  CHECK(kv.shape == std::array<std::int64_t, 4>{1, 1, 5, 4});
  const Int32Tensor q = bm->tensor(BlockMaskField::full_q_num_blocks);
  CHECK(q.rank == 3);
  CHECK(q.shape[2] == 4);
  CHECK(bm->block_size() == std::array<std::int64_t, 2>{8, 16});
  CHECK(bm->seq_lengths() == std::array<std::int64_t, 2>{Q, K});

  // Heads broadcast, batches stored: one slice per batch.
  const std::int64_t shape[4] = {B, 1, Q, K};
  std::vector<std::uint8_t> data(static_cast<std::size_t>(B * Q * K));
  for (auto& x : data) x = static_cast<std::uint8_t>(coin(rng, 0.3));
  auto v = MaskView::contiguous(data.data(), ElementType::boolean, shape);
  REQUIRE(v.ok());
  auto heads = v->broadcast_to(B, H);
  REQUIRE(heads.ok());
  auto u = scan_tiles(*heads, size);
  REQUIRE(u.ok());
  CHECK(u->grid.distinct_batch == B);
  CHECK(u->grid.distinct_heads == 1);
  check_summary(*heads, size, *u, "heads broadcast");

  // A structure with one modifier entry for every batch: one slice.
  auto s = make_structure(StructureKind::causal, 5, 64, 64);
  s.kv_valid = {{8, 64}};
  auto d = tiles_from_structure(s, TileSize{16, 16});
  REQUIRE(d.ok());
  CHECK(d->grid.distinct_batch == 1);
  s.kv_valid = {{8, 64}, {0, 64}, {0, 64}, {0, 64}, {0, 32}};
  d = tiles_from_structure(s, TileSize{16, 16});
  REQUIRE(d.ok());
  CHECK(d->grid.distinct_batch == 5);
}

TEST_CASE("the layout of torch's create_block_mask: a worked example") {
  // Causal 5 x 5 keys at 2 x 2 tiles: q tiles {0,1}, {2,3}, {4}; k tiles likewise.
  // Tile (0,0) is partial (row 0 misses key 1), (1,0) full, (1,1) partial, (2,0) and
  // (2,1) are ragged (never full), (2,2) ragged and partial.
  auto s = make_structure(StructureKind::causal, 1, 5, 5);
  auto t = tiles_from_structure(s, TileSize{2, 2});
  REQUIRE(t.ok());
  auto bm = block_mask_tensors(*t);
  REQUIRE(bm.ok());
  CHECK(bm->kv_num_blocks == std::vector<std::int32_t>{1, 1, 3});
  CHECK(bm->kv_indices == std::vector<std::int32_t>{0, 1, 2, /**/ 1, 0, 2, /**/ 0, 1, 2});
  CHECK(bm->full_kv_num_blocks == std::vector<std::int32_t>{0, 1, 0});
  CHECK(bm->full_kv_indices == std::vector<std::int32_t>{0, 1, 2, /**/ 0, 1, 2, /**/ 0, 1, 2});
  CHECK(bm->q_num_blocks == std::vector<std::int32_t>{2, 2, 1});
  CHECK(bm->q_indices == std::vector<std::int32_t>{0, 2, 1, /**/ 1, 2, 0, /**/ 2, 0, 1});
  CHECK(bm->full_q_num_blocks == std::vector<std::int32_t>{1, 0, 0});
  CHECK(bm->full_q_indices == std::vector<std::int32_t>{1, 0, 2, /**/ 0, 1, 2, /**/ 0, 1, 2});
  CHECK(t->tally().empty == 3);
  CHECK(t->tally().partial == 5);
  CHECK(t->tally().full == 1);
  CHECK(cute_name(BlockMaskField::kv_num_blocks) == "mask_block_cnt");
  CHECK(cute_name(BlockMaskField::full_kv_indices) == "full_block_idx");
  // Each side holds one tensor of each CuTe name.
  std::vector<std::string_view> kv, q;
  for (const BlockMaskField f : kBlockMaskFields) (is_kv_side(f) ? kv : q).push_back(cute_name(f));
  CHECK(kv == std::vector<std::string_view>{"mask_block_cnt", "mask_block_idx", "full_block_cnt", "full_block_idx"});
  CHECK(q == kv);
  CHECK(is_kv_side(BlockMaskField::full_kv_indices));
  CHECK_FALSE(is_kv_side(BlockMaskField::q_num_blocks));
}

TEST_CASE("bad tile input gives an error naming it") {
  const std::int64_t shape[2] = {4, 4};
  std::vector<std::uint8_t> data(16, 1);
  auto v = MaskView::contiguous(data.data(), ElementType::boolean, shape);
  REQUIRE(v.ok());
  for (TileSize bad : {TileSize{0, 4}, TileSize{-3, 4}, TileSize{4, 0}, TileSize{4, -1}}) {
    auto t = scan_tiles(*v, bad);
    REQUIRE_FALSE(t.ok());
    CHECK(t.status().code() == ErrorCode::invalid_argument);
    CHECK(t.status().message().find(bad.q < 1 ? "tile size q" : "tile size k") != std::string::npos);
    auto d = tiles_from_structure(make_structure(StructureKind::causal, 1, 4, 4), bad);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().message().find("tile size") != std::string::npos);
  }
  // More than 2^31 - 1 tiles a side: torch's int32 indices cannot name them. A stride-0
  // key dimension holds it in one byte.
  const std::int64_t wide[2] = {1, (std::int64_t{1} << 31) + 5};
  const std::int64_t zero[2] = {0, 0};
  std::uint8_t one = 1;
  auto w = MaskView::make(&one, ElementType::boolean, wide, zero);
  REQUIRE(w.ok());
  auto t = scan_tiles(*w, TileSize{1, 1});
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().message().find("int32") != std::string::npos);
  // An arbitrary structure has no fields to derive tiles from.
  auto a = tiles_from_structure(make_structure(StructureKind::arbitrary, 1, 4, 4));
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().message().find("scan_tiles") != std::string::npos);
  // NaN in an additive mask names the element, as scan() does.
  std::vector<float> f(16, 0.0f);
  f[9] = std::nanf("");
  auto fv = MaskView::contiguous(f.data(), ElementType::float32, shape);
  REQUIRE(fv.ok());
  auto n = scan_tiles(*fv, TileSize{2, 2});
  REQUIRE_FALSE(n.ok());
  CHECK(n.status().code() == ErrorCode::invalid_value);
  CHECK(n.status().message().find("[0, 0, 2, 1]") != std::string::npos);
  // A summary whose states do not match its grid.
  TileSummary broken;
  broken.grid = *make_tile_grid(1, 1, 4, 4, TileSize{2, 2});
  CHECK_FALSE(block_mask_tensors(broken).ok());
}

TEST_CASE("tile_summary_from_states: a summary's own states round-trip; bad bytes and sizes are named") {
  // Round trip: a scanned block-structured summary (8 x 8 blocks empty, full or holed;
  // ragged, per head: every state, full tiles included) rebuilt from its bytes.
  Rng rng(test_seed(1408));
  TileTally seen;
  for (int c = 0; c < 20; ++c) {
    const std::int64_t Q = uniform(rng, 1, 300), K = uniform(rng, 1, 300);
    std::vector<std::uint8_t> data(static_cast<std::size_t>(2 * Q * K));
    std::vector<int> block_mode(static_cast<std::size_t>(2 * (Q / 8 + 1) * (K / 8 + 1)));
    for (auto& m : block_mode) m = static_cast<int>(uniform(rng, 0, 2));  // empty, full, holed
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t q = 0; q < Q; ++q)
        for (std::int64_t k = 0; k < K; ++k) {
          const int mode = block_mode[static_cast<std::size_t>((h * (Q / 8 + 1) + q / 8) * (K / 8 + 1) + k / 8)];
          data[static_cast<std::size_t>((h * Q + q) * K + k)] = mode == 1 || (mode == 2 && coin(rng, 0.5)) ? 1 : 0;
        }
    const std::int64_t shape[4] = {1, 2, Q, K};
    auto v = MaskView::contiguous(data.data(), ElementType::boolean, shape);
    REQUIRE(v.ok());
    const TileSize size{8 * uniform(rng, 1, 4), 8 * uniform(rng, 1, 4)};
    auto scanned = scan_tiles(*v, size);
    REQUIRE(scanned.ok());
    const TileTally t = scanned->tally();
    seen.empty += t.empty;
    seen.partial += t.partial;
    seen.full += t.full;
    auto rebuilt = tile_summary_from_states(scanned->grid,
                                            reinterpret_cast<const std::uint8_t*>(scanned->states.data()),
                                            scanned->states.size());
    REQUIRE(rebuilt.ok());
    CHECK(rebuilt->states == scanned->states);
    CHECK(rebuilt->grid.tiles() == scanned->grid.tiles());
  }
  CHECK(seen.empty > 0);
  CHECK(seen.partial > 0);
  CHECK(seen.full > 0);
  const TileGrid g = *make_tile_grid(1, 2, 5, 8, TileSize{4, 4}, 1, 2);  // 2 x 2 tiles a slice, q ragged
  std::vector<std::uint8_t> states(8, 0);
  CHECK(tile_summary_from_states(g, states.data(), 7).status().message() == "states hold 7 bytes; the grid has 8 tiles");
  CHECK(tile_summary_from_states(g, nullptr, 8).status().message() == "states is null");
  TileGrid bad = g;
  bad.block_q = 0;  // a grid no make_tile_grid made: checked, not divided by
  CHECK(tile_summary_from_states(bad, states.data(), 8).status().message() ==
        "tile size q (block_q) must be in [1, 2^62], got 0");
  states[5] = 3;
  CHECK(tile_summary_from_states(g, states.data(), 8).status().message() ==
        "tile [1, 0, 1] (slice, q tile, k tile) holds 3; a state is 0 (empty), 1 (partial) or 2 (full)");
  states[5] = 2;  // tile (0, 1) is whole: full is fine
  CHECK(tile_summary_from_states(g, states.data(), 8).ok());
  states[6] = 2;  // tile (1, 0): rows 4..4 of 5, ragged
  CHECK(tile_summary_from_states(g, states.data(), 8).status().message() ==
        "tile [1, 1, 0] (slice, q tile, k tile) holds 2, full, but the tile is ragged");
}

TEST_CASE("tile_fractions: only arbitrary takes them, as shares") {
  auto s = make_structure(StructureKind::arbitrary, 1, 256, 256);
  s.tile_fractions = TileFractions{128, 128, 0.25, 0.5};
  CHECK(s.validate().ok());
  const auto rejects = [&](TileFractions t, const char* needle) {
    MaskStructure x = s;
    x.tile_fractions = t;
    const Status st = x.validate();
    CHECK(st.code() == ErrorCode::invalid_argument);
    CHECK_MESSAGE(st.message().find(needle) != std::string::npos, st.message());
  };
  rejects({128, 128, -0.1, 0.5}, "shares");
  rejects({128, 128, 0.7, 0.5}, "shares");
  rejects({128, 128, std::nan(""), 0}, "shares");
  rejects({0, 128, 0.1, 0.1}, "tile_fractions.block");
  MaskStructure causal = make_structure(StructureKind::causal, 1, 256, 256);
  causal.tile_fractions = TileFractions{};
  CHECK(causal.validate().message().find("only arbitrary") != std::string::npos);
}

TEST_CASE("decide() charges FlexAttention on tiles: an arbitrary block-sparse mask") {
  AttentionCall call = seed_call();
  Environment env = h200();
  env.available |= kFamilyFlex;
  const std::int64_t L = 16384;
  auto s = make_structure(StructureKind::arbitrary, 1, L, L);
  // Tiles unknown: every one charged as partial, so the dense mask on cuDNN is cheaper.
  auto unknown = decide(s, call, env);
  REQUIRE(unknown.ok());
  CHECK(unknown->backend() == Backend::sdpa_cudnn);
  // A block-sparse mask: 10 % of its tiles partial, 20 % full. Flex reads the mask only
  // in the partial ones and skips the empty 70 %.
  s.tile_fractions = TileFractions{128, 64, 0.10, 0.20};
  auto sparse = decide(s, call, env);
  REQUIRE(sparse.ok());
  CHECK(sparse->backend() == Backend::flex_attention);
  CHECK(sparse->call.mask == MaskUse::keep);
  const FlexArgs* a = sparse->call.get<FlexArgs>();
  REQUIRE(a != nullptr);
  CHECK(a->mask_mod_reads_mask);
  CHECK(a->block_q == 128);
  CHECK(a->block_k == 64);
  const double pairs = static_cast<double>(L) * static_cast<double>(L) * (0.20 + kFlexPartialTileMaskRead * 0.10);
  CHECK(sparse->cost_ms == doctest::Approx(kCallOverheadMs + 5.6 * work_units(pairs, call)));
  // Mostly partial tiles: every one reads the mask, and the dense mask on cuDNN wins.
  s.tile_fractions = TileFractions{128, 128, 0.85, 0.05};
  auto partial = decide(s, call, env);
  REQUIRE(partial.ok());
  CHECK(partial->backend() == Backend::sdpa_cudnn);
  CHECK(std::any_of(partial->rejected.begin(), partial->rejected.end(), [](const Rejection& r) {
    return r.backend == Backend::flex_attention && r.kind == RejectionKind::slower;
  }));
}

TEST_CASE("decide() on scanned tiles: a block-sparse mask goes to flex, the same density scattered does not") {
  AttentionCall call = seed_call();
  Environment env = h200();
  env.available |= kFamilyFlex;
  Rng rng(7);
  const std::int64_t L = 2048, T = 128, n = L / T;
  const std::int64_t shape[2] = {L, L};
  // Whole 128 x 128 blocks kept (a quarter of them), causal inside the diagonal ones.
  std::vector<std::uint8_t> blocks(static_cast<std::size_t>(L * L), 0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j <= i; ++j) {
      if (i != j && !coin(rng, 0.4)) continue;
      for (std::int64_t q = i * T; q < (i + 1) * T; ++q)
        for (std::int64_t k = j * T; k < (j + 1) * T && k <= q; ++k) blocks[static_cast<std::size_t>(q * L + k)] = 1;
    }
  // The same number of attending elements, scattered: every tile partial.
  const auto kept = std::count(blocks.begin(), blocks.end(), std::uint8_t{1});
  std::vector<std::uint8_t> scattered(blocks.size(), 0);
  for (std::size_t i = 0; i < scattered.size(); ++i)
    scattered[i] = static_cast<std::uint8_t>(coin(rng, static_cast<double>(kept) / static_cast<double>(L * L)));
  for (auto* data : {&blocks, &scattered}) {
    auto view = MaskView::contiguous(data->data(), ElementType::boolean, shape);
    REQUIRE(view.ok());
    auto both = scan_with_tiles(*view);
    REQUIRE(both.ok());
    auto verdict = classify(both->spans);
    REQUIRE(verdict.ok());
    REQUIRE(verdict->kind == StructureKind::arbitrary);
    verdict->tile_fractions = both->tiles.fractions();
    auto p = decide(*verdict, call, env);
    REQUIRE(p.ok());
    if (data == &blocks) {
      CHECK(p->backend() == Backend::flex_attention);
      CHECK(both->tiles.fractions().full > 0.2);
    } else {
      CHECK(p->backend() != Backend::flex_attention);
      CHECK(both->tiles.fractions().partial == 1.0);
    }
  }
}

TEST_CASE("flex on exact structures: charged on the structure's tiles, chosen where torch has no native call") {
  AttentionCall c = seed_call();
  c.head_dim = 128;
  Environment env = h200();
  env.available |= kFamilyFlex;
  const std::int64_t L = 69632;
  // The 4096 window the flex rate was fitted on: 16368 full and 1056 partial tiles, 5.53 ms measured.
  auto window = make_structure(StructureKind::sliding_window, 1, L, L);
  window.window = 4096;
  const TileFractions tiles = structure_tile_fractions(window, TileSize{});
  const double all = 544.0 * 544.0;
  CHECK(tiles.full * all == doctest::Approx(16368));
  CHECK(tiles.partial * all == doctest::Approx(1056));
  auto w = decide(window, c, env);
  REQUIRE(w.ok());
  CHECK(w->backend() == Backend::flex_attention);
  CHECK(w->call.mask == MaskUse::replace);
  CHECK(w->cost_ms == doctest::Approx(5.53 + kCallOverheadMs).epsilon(0.005));
  // The dense causal mask the mask-reading rate was fitted on: 8128 full, 128 partial, 3.04 ms.
  const auto causal = make_structure(StructureKind::causal, 1, 16384, 16384);
  const TileFractions ct = structure_tile_fractions(causal, TileSize{});
  CHECK(ct.full * 128 * 128 == doctest::Approx(8128));
  CHECK(ct.partial * 128 * 128 == doctest::Approx(128));
  const double mask_read = 5.6 * work_units(flex_pairs(causal, ct, true), c);
  CHECK(mask_read == doctest::Approx(3.04).epsilon(0.005));
  // Shapes torch runs otherwise with a dense mask, varlen_attn or a long plan: flex when
  // offered. 128 chunks of 1024: more calls than a plan may take, and flex's tiles cost
  // less than varlen_attn's chunks (a chunk of 256, two tiles wide, would not).
  auto chunked = make_structure(StructureKind::chunked, 1, 131072, 131072);
  chunked.chunk = 1024;
  auto blocks = make_structure(StructureKind::causal_blocks, 1, 32768, 32768);
  for (std::int64_t at = 100; at + 300 < 32768; at += 400) blocks.blocks.push_back({at, at + 300});
  // A prefix-LM mask: no native call takes a bidirectional prefix; torch alone needs the
  // dense mask or a plan.
  auto prefix_lm = make_structure(StructureKind::prefix_lm, 1, L, L);
  prefix_lm.prefix = 4096;
  for (const MaskStructure& s : {chunked, blocks, prefix_lm}) {
    auto torch_only = decide(s, c);
    auto with_flex = decide(s, c, env);
    REQUIRE(torch_only.ok());
    REQUIRE(with_flex.ok());
    CHECK_MESSAGE(with_flex->backend() == Backend::flex_attention, describe(s));
    CHECK(with_flex->cost_ms < torch_only->cost_ms);
  }
  // Plain causal stays on cuDNN: flex's attended-pairs estimate already loses, so its
  // tiles are not counted.
  auto p = decide(causal, c, env);
  REQUIRE(p.ok());
  CHECK(p->backend() == Backend::sdpa_cudnn);
}

}  // TEST_SUITE
