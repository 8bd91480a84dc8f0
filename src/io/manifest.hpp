// A checkpoint folder's MANIFEST: the name, size and XXH3-64 hash of every file in it, written last (the
// folder is published by a rename after it) and checked before any file is opened, so that a damaged
// byte anywhere in a file, HDF5's own structures included, is found without parsing it.
//   gpt2-train manifest 1
//   rank_00000.h5 123456789 0123456789abcdef
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct FileDigest {
  std::string name;   // within the folder
  uint64_t size = 0;  // bytes
  uint64_t xxh3 = 0;  // XXH3-64 of the whole file
};

// dir/MANIFEST, synced to disk before it returns.
void write_manifest(const std::string& dir, const std::vector<FileDigest>& files);
// The listed files; input_error naming the folder when MANIFEST is missing or malformed.
std::vector<FileDigest> read_manifest(const std::string& dir);
// input_error naming the file when it is missing, of another size ("truncated") or its hash differs
// ("checksum mismatch").
void verify_file(const std::string& dir, const FileDigest& want);

}  // namespace gpt
