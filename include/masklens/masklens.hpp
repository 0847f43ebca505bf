// masklens — umbrella header (host only: any C++20 compiler, no CUDA, no third-party deps).
#pragma once

#include "config.hpp"
#include "status.hpp"
#include "element.hpp"
#include "mask_view.hpp"
#include "row_span.hpp"
#include "span_table.hpp"
#include "scan.hpp"
#include "structure.hpp"
#include "classify.hpp"
#include "describe.hpp"
#include "render.hpp"
#include "call.hpp"
#include "defects.hpp"
#include "plan.hpp"
#include "policy.hpp"
#include "inspect.hpp"
