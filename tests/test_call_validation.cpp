// AttentionCall::validate and Environment::validate: the one check of a call's ranges
// that the C++ API, the CLI and the Python package share.
#include <doctest/doctest.h>

#include <masklens/call.hpp>

#include <string>

using namespace masklens;

TEST_SUITE("host") {

namespace {
std::string message_of(const Status& s) { return s.ok() ? std::string("ok") : s.message(); }
}  // namespace

TEST_CASE("a call's counts are >= 1 and at most 2^62; 0 keeps its documented default") {
  CHECK(AttentionCall{}.validate().ok());
  AttentionCall c;
  c.head_dim = kMaxCallExtent;
  c.head_dim_v = kMaxCallExtent;  // their sum overflowed int64 in the cost model before the bound
  CHECK(c.validate().ok());
  c.head_dim = kMaxCallExtent + 1;
  CHECK(message_of(c.validate()) == "call.head_dim must be >= 1 and at most 2^62, got 4611686018427387905");
  c = AttentionCall{};
  c.head_dim = INT64_MAX;  // what a saturating parser made of 1e23
  CHECK(c.validate().code() == ErrorCode::invalid_argument);
  c = AttentionCall{};
  c.heads = INT64_MAX;
  CHECK(message_of(c.validate()).starts_with("call.heads must be >= 1 and at most 2^62"));
  c = AttentionCall{};
  c.kv_heads = -2;
  CHECK(message_of(c.validate()) == "call.kv_heads must be >= 1 and at most 2^62 (or 0 for heads), got -2");
  c = AttentionCall{};
  c.q_len = INT64_MAX;
  CHECK(message_of(c.validate()).starts_with("call.q_len must be"));
  c = AttentionCall{};
  c.dropout = 1;
  CHECK(message_of(c.validate()) == "call.dropout must be in [0, 1), got 1");
}

TEST_CASE("an environment's sm is a compute capability from 10 to 129, for every caller") {
  Environment e;
  for (int sm : {10, 75, 90, 120, 129}) {
    e.sm = sm;
    CHECK_MESSAGE(e.validate().ok(), sm);
  }
  for (int sm : {-5, 0, 9, 130, 1000}) {
    e.sm = sm;
    CHECK_MESSAGE(message_of(e.validate()) ==
                      "environment.sm must be a compute capability major*10+minor from 10 to 129 (80 = A100, "
                      "90 = H100), got " + std::to_string(sm),
                  sm);
  }
}

}  // TEST_SUITE
