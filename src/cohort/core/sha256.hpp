// defines: sha256_hex
// FIPS 180-4 SHA-256, for rendezvous secrets and checkpoint checksums.
#pragma once

#include <cstddef>
#include <string>

namespace cohort {

std::string sha256_hex(const void* data, size_t size);
inline std::string sha256_hex(const std::string& s) { return sha256_hex(s.data(), s.size()); }

}  // namespace cohort
