// inspect: view -> structure in one call (host scan, then the shared classifier).
// scan_threads.hpp adds inspect(view, ScanOptions), the scan split over threads.
#pragma once

#include "classify.hpp"
#include "mask_view.hpp"
#include "scan.hpp"

namespace masklens {

inline Result<MaskStructure> inspect(const MaskView& view) {
  Result<SpanTable> spans = scan(view);
  if (!spans) return spans.status();
  return classify(*spans);
}

}  // namespace masklens
