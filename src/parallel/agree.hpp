// Agreement before acting: a phase that may fail on some ranks only runs on every rank, then all ranks
// learn the worst outcome, so either all go on or all fail together with a named error (no rank walks
// on alone into a collective that the others never join).
#pragma once
#include <cstdint>
#include <string>

#include "base/common.hpp"
#include "parallel/comm.hpp"

namespace gpt {

// An error every rank raises together, after agreeing on it: it ends the run on every rank, and the
// job goes on (the next sweep point) or ends with its status. Any other error on a multi-rank run may
// be one rank's alone, with the others waiting for it in a collective: that ends the job (MPI_Abort).
class AgreedError : public Error {
 public:
  using Error::Error;
  explicit AgreedError(const Error& e) : Error(e) {}
};

// The message of the highest-numbered rank that has one (`mine` empty: none here), on every rank; with
// " (on rank N)" on the others unless every rank has that same message (the same bad input everywhere).
inline std::string shared_message(HostComm& host, const std::string& mine) {
  const int from = int(host.max(mine.empty() ? -1 : host.rank()));
  if (from < 0) return "";
  uint64_t n = host.rank() == from ? mine.size() : 0;
  host.broadcast(&n, sizeof n, from);
  std::string text = host.rank() == from ? mine : std::string(n, '\0');
  if (n) host.broadcast(text.data(), n, from);
  const bool everywhere = host.max(mine == text ? 0L : 1L) == 0;
  return from == host.rank() || everywhere ? text : text + " (on rank " + std::to_string(from) + ")";
}

// Runs fn; if it threw on any rank, every rank throws the same error: the exit status and message of a
// rank where it failed (so rank 0, which reports, names what another rank found).
template <class Fn>
void agreed(HostComm& host, const std::string& what, Fn&& fn) {
  std::string err;
  long code = 0;
  try {
    fn();
  } catch (const Error& e) {
    err = e.what();
    code = e.code();
  } catch (const std::exception& e) {  // a library's own exception (filesystem, allocation): a failure too
    err = what + ": " + e.what();
    code = kExitFailure;
  }
  const long worst = host.max(code);
  if (worst == 0) return;
  const std::string msg = shared_message(host, err);
  throw AgreedError(ExitCode(err.empty() ? worst : code), msg.empty() ? what + " failed on another rank" : msg);
}

}  // namespace gpt
