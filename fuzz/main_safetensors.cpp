// libFuzzer entry point: fuzz.hpp
#include "fuzz.hpp"

COHORT_FUZZ_TARGET(safetensors)
