// A backend added in one row: this program is compiled with the hook of
// tests/fake_backend/ (one family row, one registry row, one header) and checks that
// the backend is everywhere a built-in one is: decide(), its rejections, the names,
// the families, the rendered arguments, the printed Python and the JSON contract.
#include <doctest/doctest.h>

#include <masklens/call_args.hpp>
#include <masklens/json.hpp>
#include <masklens/masklens.hpp>

using namespace masklens;

namespace {

namespace fake = backends::fake_attn;

Environment with_fake(int sm = 90) {
  Environment e;
  e.sm = sm;
  e.available = kFamilyTorch | fake::kFamily;
  return e;
}

const Rejection* rejection_of(const Policy& p, Backend b) {
  for (const Rejection& r : p.rejected)
    if (r.backend == b) return &r;
  return nullptr;
}

const MaskStructure kCausal = make_structure(StructureKind::causal, 1, 256, 256);

}  // namespace

TEST_CASE("the fake backend is a registry row, a family and a name") {
  CHECK(std::size(kAllBackends) == static_cast<std::size_t>(fake::kId) + 1);
  CHECK(to_string(fake::kId) == "fake_attn");
  CHECK(backend_named("fake_attn") == fake::kId);
  CHECK(family(fake::kId) == fake::kFamily);
  CHECK(family_info(fake::kId).name == "fake_attn");
  REQUIRE(family_named("fake_attn") != nullptr);
  CHECK((kEveryFamily & fake::kFamily) != 0);
  CHECK(family_names().ends_with(", fake_attn"));
  CHECK(with_every_family().has(fake::kFamily));
  CHECK(with_fake().validate().ok());
}

TEST_CASE("decide() picks the fake backend where its family is available") {
  auto p = decide(kCausal, AttentionCall{}, with_fake());
  REQUIRE(p);
  CHECK(p->backend() == fake::kId);
  CHECK(p->call.mask == MaskUse::drop);
  REQUIRE(p->call.get<KernelArgs>() != nullptr);
  CHECK(p->call.get<KernelArgs>()->causal);
  // Its cost: the row's rate times the work (cost.hpp), and the built-in ones slower.
  const double expected = kCallOverheadMs + 0.5 * work_units(attended_pairs(kCausal), AttentionCall{});
  CHECK(p->cost_ms == doctest::Approx(expected));
  const Rejection* cudnn = rejection_of(*p, Backend::sdpa_cudnn);
  REQUIRE(cudnn != nullptr);
  CHECK(cudnn->kind == RejectionKind::slower);
}

TEST_CASE("the fake backend is rejected as every backend is") {
  SUBCASE("unavailable") {
    Environment torch_only;
    auto p = decide(kCausal, AttentionCall{}, torch_only);
    REQUIRE(p);
    CHECK(p->backend() != fake::kId);
    const Rejection* r = rejection_of(*p, fake::kId);
    REQUIRE(r != nullptr);
    CHECK(r->kind == RejectionKind::unavailable);
  }
  SUBCASE("refused by its rule") {
    auto p = decide(kCausal, AttentionCall{}, with_fake(75));
    REQUIRE(p);
    const Rejection* r = rejection_of(*p, fake::kId);
    REQUIRE(r != nullptr);
    CHECK(r->kind == RejectionKind::refused);
    CHECK(r->reason() == "fake_attn needs sm80 or newer, got sm75");
    CHECK(r->source == "tests/fake_backend/fake_attn.hpp");
  }
  SUBCASE("inexpressible") {
    MaskStructure window = make_structure(StructureKind::sliding_window, 1, 256, 256);
    window.window = 64;
    auto p = decide(window, AttentionCall{}, with_fake());
    REQUIRE(p);
    const Rejection* r = rejection_of(*p, fake::kId);
    REQUIRE(r != nullptr);
    CHECK(r->kind == RejectionKind::inexpressible);
    CHECK(r->reason() == "takes no dense mask and cannot express sliding_window natively");
  }
}

TEST_CASE("the fake backend's call renders through its row") {
  auto p = decide(kCausal, AttentionCall{}, with_fake());
  REQUIRE(p);
  const CallArgs args = backend_args(p->call, 1, 256, 256);
  REQUIRE(args.args.size() == 1);
  CHECK(args.args[0].name == "causal");
  CHECK(python_call(p->call, 1, 256, 256, std::nullopt) == "out = fake_attn.attention(q, k, v, causal=True)");

  const nlohmann::json j = to_json(kCausal, &*p);
  CHECK(j["policy"]["backend"] == "fake_attn");
  CHECK(j["policy"]["args"] == nlohmann::json{{"causal", true}});
  CHECK(j["policy"]["call"]["type"] == "kernel");
}
