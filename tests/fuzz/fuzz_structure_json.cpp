// libFuzzer: the structure JSON reader of `masklens policy` never crashes, and what it
// accepts renders and decides.
#include <masklens/json.hpp>

#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size), nullptr, false);
  if (j.is_discarded()) return 0;
  const std::int64_t q = 1 + (size % 37), k = (size % 3) ? q : 1 + (size % 53);
  auto s = masklens::structure_from_json(j, 1 + size % 3, 1, q, k);
  if (!s) return 0;
  for (std::int64_t b = 0; b < s->batch; ++b)
    for (std::int64_t row = 0; row < s->q_len; ++row) {
      const masklens::RowSpan r = s->row(b, row);
      // The interval form and the element-wise definition agree.
      for (std::int64_t key = 0; key < s->k_len && s->kind != masklens::StructureKind::arbitrary; ++key)
        if (s->allows(b, row, key) != (!r.empty() && r.first <= key && key <= r.last)) __builtin_trap();
    }
  (void)masklens::decide(*s, masklens::AttentionCall{});
  return 0;
}
