// decide: the header a framework includes before its attention call — inspect (view ->
// structure) and decide (structure + call -> Policy) — without the rest of the umbrella
// (describe, render). Its parse cost is measured in bench/README.md (parse_cost.sh).
#pragma once

#include "inspect.hpp"
#include "policy.hpp"
