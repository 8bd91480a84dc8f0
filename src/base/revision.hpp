// The revision this binary was built from, as the run log records it (`git_rev`): the commit, with
// "-dirty" when tracked files differed from it, or "unknown" outside a git checkout. Defined by a source
// file the Makefile generates (and rewrites only when the revision changes).
#pragma once

namespace gpt {

const char* build_revision();

}  // namespace gpt
