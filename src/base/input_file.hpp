// Input files the trainer opens (data shards, evaluation files, the vocabulary, init_from, the YAML).
#pragma once
#include <string>

namespace gpt {

// Before an input file is opened: a FIFO, a device or a socket there is refused (input_error "WHAT: 'PATH' is
// a FIFO (named pipe), not a regular file ..."), since opening a FIFO blocks until something writes to it
// and a device such as /dev/urandom never ends. An absent path or a folder passes: the caller's open or
// its own check names those.
void check_input_file(const std::string& path, const std::string& what);

}  // namespace gpt
