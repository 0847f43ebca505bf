// The baseline classifier in a translation unit of its own: its inline helpers live in
// masklens::before::detail, apart from the current ones, and bench/classify calls it
// through this one function.
#include "classify_before.hpp"

namespace masklens::before {

Result<MaskStructure> classify_baseline(const SpanTable& table) { return classify(table); }

}  // namespace masklens::before
