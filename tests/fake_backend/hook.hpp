// What a test program adds to masklens through the hook (compiled with
// -DMASKLENS_EXTRA_BACKENDS="fake_backend/hook.hpp"): one family row, expanded at the end
// of kFamilies (families.hpp); the backend's one header, included by registry.hpp; and one
// registry row, expanded at the end of kRegistry. A backend shipped with masklens writes
// the same rows into those tables and nothing else (docs/backends.md, "Adding a
// backend"); the hook lets a test add them without touching the real tables. Macros
// only: call.hpp reads this file before any of its own declarations.
#pragma once

// The fake family: the first bit the real table leaves free.
#define MASKLENS_EXTRA_FAMILY_ROWS \
  {.name = "fake_attn", .bit = static_cast<BackendFamily>(1u << 9), .python_module = "fake_attn"},

#define MASKLENS_EXTRA_BACKEND_HEADER "fake_backend/fake_attn.hpp"

#define MASKLENS_EXTRA_BACKEND_ROWS                                                                      \
  {.id = fake_attn::kId, .name = "fake_attn", .family = fake_attn::kFamily, .rules = fake_attn::kRules, \
   .native = fake_attn::native, .rates = {0.5, 0, false}, .args = fake_attn::args,                     \
   .python = fake_attn::python},
