// Precompiled into every translation unit of the library, the app and the
// tests. Only heavy, stable third-party headers belong here.
#pragma once

#include <torch/torch.h>
#include <nlohmann/json.hpp>
