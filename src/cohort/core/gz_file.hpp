// defines: GzFile, open_gz_input, gz_read_some, gz_read_full
//
// Input through zlib, which reads plain files as they are and gzip (and
// dictzip) files decompressed: the IDX images and the text `cohort prepare`
// reads. Errors are DataError naming the file.
#pragma once

#include <zlib.h>

#include <cstddef>
#include <memory>
#include <string>

namespace cohort {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Opens `path` for reading. A missing file or a directory is a DataError,
// and so is a name ending in .gz or .dz whose content is not compressed (a
// wrong or damaged file, not text).
GzFile open_gz_input(const std::string& path);

// Up to n bytes; 0 at the end. A corrupt stream, or a compressed one cut
// short (zlib returns what it could decompress and says so only at the
// end), is a DataError.
size_t gz_read_some(gzFile f, const std::string& path, void* dst, size_t n);

// n bytes, fewer only at the end.
size_t gz_read_full(gzFile f, const std::string& path, void* dst, size_t n);

}  // namespace cohort
