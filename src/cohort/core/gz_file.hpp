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

// What a name ending in .gz or .dz promises.
enum class GzSuffix {
  kMeansCompressed,  // its content must be compressed: else a wrong or damaged file (text input)
  kAnyContent,       // plain content under such a name is read as it is (IDX images, as zlib tools do)
};

// Opens `path` for reading. A missing file or a directory is a DataError,
// and so is, under kMeansCompressed, a name ending in .gz or .dz whose
// content is not compressed.
GzFile open_gz_input(const std::string& path, GzSuffix suffix = GzSuffix::kMeansCompressed);

// Up to n bytes; 0 at the end. A corrupt stream, or a compressed one cut
// short (zlib returns what it could decompress and says so only at the
// end), is a DataError; gz_cut_short(f) then tells the second case.
size_t gz_read_some(gzFile f, const std::string& path, void* dst, size_t n);

// n bytes, fewer only at the end.
size_t gz_read_full(gzFile f, const std::string& path, void* dst, size_t n);

// After a DataError from gz_read_some: the compressed stream ended before
// its end marker (a file cut short), rather than holding bad data.
bool gz_cut_short(gzFile f);

}  // namespace cohort
