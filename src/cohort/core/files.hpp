// defines: read_file, write_file_durably, write_file_atomically, commit_file, sync_path
//
// Files that are either wholly there or not at all. A writer puts its bytes
// in PATH.tmp, fsyncs them, renames the file over PATH and fsyncs the
// directory, so that a crash or power loss leaves the old file or the new
// one, never a torn one: checkpoints, manifests, metrics.jsonl rewrites and
// HDF5 shards all go through here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cohort {

// The whole file. DataError naming it when missing or unreadable.
std::string read_file(const std::string& path);

// Writes `parts`, one after the other, to `path` (created or truncated) and
// fsyncs it, with the system's own calls so that a failure says why. In
// place, so not atomic by itself: for files inside a temporary directory
// that is renamed into place (a checkpoint), or for PATH.tmp. Error
// naming the file and the reason ("write failed (No space left on device)")
// on failure; the partial file is then removed.
void write_file_durably(const std::string& path, const std::vector<std::string_view>& parts);

// Writes `bytes` to `path` atomically and durably (PATH.tmp, fsync, rename,
// fsync of the directory). Error naming the file on failure; PATH is then
// untouched and PATH.tmp removed.
void write_file_atomically(const std::string& path, const std::string& bytes);

// Moves a finished `tmp` (written by another library, e.g. HDF5) over
// `path` the same way: fsync, rename, fsync of the directory. Error naming
// both on failure; `tmp` is removed.
void commit_file(const std::string& tmp, const std::string& path);

// fsync of a file or directory. Error naming it on failure.
void sync_path(const std::string& path, bool directory);

}  // namespace cohort
