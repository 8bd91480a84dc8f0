// --dry-run: every chosen point planned for its configured device (which need not be on this machine),
// its data files checked, and the result printed: one point's whole plan, or for a sweep one table with
// a row per point. Nothing is written.
#pragma once
#include <vector>

#include "dist/comm.hpp"
#include "run/sweep.hpp"

namespace gpt {
// Throws input_error naming the key or the file of the first point that cannot run.
void dry_run(const Config& base, const Sweep& sw, const std::vector<int>& indices, HostComm& host);
}  // namespace gpt
