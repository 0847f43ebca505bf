// inspect: view -> structure in one call (host scan, then the shared classifier).
#pragma once

#include "classify.hpp"
#include "mask_view.hpp"
#include "scan.hpp"

namespace masklens {

inline Result<MaskStructure> inspect(const MaskView& view, ScanOptions options = {}) {
  Result<SpanTable> spans = scan(view, options);
  if (!spans) return spans.status();
  return classify(*spans);
}

}  // namespace masklens
