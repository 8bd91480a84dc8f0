// A checkpoint folder's MANIFEST: every file in it with its size and the XXH3-64 hashes of byte ranges
// that tile it, written last (the folder is published by a rename after it), so that a damaged byte
// anywhere in a file, HDF5's own structures included, is found. Version 2, one block per file:
//   gpt2-train manifest 2
//   file rank_00000.h5 123456789
//   m 0 4096 0123456789abcdef          the file's structure: checked before HDF5 opens the file
//   d 4096 67108864 fedcba9876543210   a dataset's bytes (at most 64 MiB): checked as they are read
// Version 1 (still read) had one line per file, `NAME SIZE XXH3` of the whole file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/raw_io.hpp"

namespace gpt {

struct FileDigest {
  std::string name;             // within the folder
  uint64_t size = 0;            // bytes
  uint64_t xxh3 = 0;            // MANIFEST 1: the XXH3-64 of the whole file
  std::vector<Extent> extents;  // MANIFEST 2: the file's byte ranges in order, [0, size) exactly
};

struct Manifest {
  int version = 2;
  std::vector<FileDigest> files;
  const FileDigest* find(const std::string& name) const;  // nullptr when it lists no such file
};

// dir/MANIFEST (version 2), synced to disk before it returns.
void write_manifest(const std::string& dir, const std::vector<FileDigest>& files);
// The listed files; input_error naming the folder when MANIFEST is missing or malformed.
Manifest read_manifest(const std::string& dir);
// Before HDF5 opens dir/want.name: input_error naming the file when it is missing or of another size
// ("truncated"), or when its structure differs from the MANIFEST ("checksum mismatch"): with version 2 the
// metadata extents are read (a small part of the file; the datasets are checked as they are read), with
// version 1 the whole file.
void verify_file(const std::string& dir, const FileDigest& want, int version, int threads);

}  // namespace gpt
