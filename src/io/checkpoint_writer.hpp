// Checkpoints written in the background. start() queues the copies of this rank's state into host memory
// (a consistent snapshot at a step boundary, io/snapshot.hpp), lays out its file with HDF5 on the calling
// (main) thread, and hands the rest to a writer thread: it waits for the copies, then pwrites the
// datasets' bytes on several threads, hashing each range for the MANIFEST as it goes, and fsyncs.
// Training goes on meanwhile; no MPI and no HDF5 are called off the main thread. finish(),
// at the same point on every rank, agrees on every rank's outcome and publishes (io/checkpoint.hpp's
// protocol: MANIFEST last, rename, `latest`, keep_last), or removes the .tmp folder of a failed write.
// At most one checkpoint is in flight, and its snapshot buffers are reused by the next.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "io/checkpoint.hpp"

namespace gpt {

struct CheckpointOutcome {
  int64_t step = -1;     // -1: nothing was in flight
  double bytes = 0;      // this rank's file
  double stall_s = 0;    // training stopped to queue the snapshot's copies and lay the file out
  double written_s = 0;  // from the snapshot to this rank's file written, hashed and synced
};

class CheckpointWriter {
 public:
  CheckpointWriter(std::string run_dir, HostComm& host, int keep_last, int threads);
  ~CheckpointWriter();  // waits for the writer thread; an unpublished write stays a .tmp folder
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // The snapshot's host memory allocated and page-locked now (at the start of a run that checkpoints)
  // rather than by the first checkpoint; false when it could not be page-locked.
  bool reserve(ZeroEngine& e, const ParamLayout& layout);
  // Collective: snapshot, layout, and the background write started (nothing may be in flight: finish()
  // first). before_write runs on the writer thread first (a testing hook). A failure here is agreed.
  void start(const TrainState& st, ZeroEngine& engine, const ParamLayout& layout,
             std::function<void()> before_write = {});
  bool in_flight() const { return flight_ != nullptr; }
  // This rank's background write still runs (the trainer's step boundary agrees on it across ranks).
  bool busy_here() const { return flight_ && !flight_->done.load(std::memory_order_acquire); }
  // Collective: waits for this rank's write, then publishes, or throws the AgreedError of a failed one.
  CheckpointOutcome finish();
  size_t snapshot_bytes() const { return snap_.bytes(); }

 private:
  struct Flight {
    int64_t step = 0;
    std::string tmp;
    std::vector<Region> regions;
    std::function<void()> before_write;
    std::thread thread;
    std::atomic<bool> done{false};
    std::string error;  // set by the writer thread before done
    FileDigest digest;
    std::chrono::steady_clock::time_point t0;
    double stall_s = 0, written_s = 0;  // written_s: set by the writer thread before done
  };
  void write(Flight& f);  // the writer thread

  const std::string run_dir_;
  HostComm& host_;
  const int keep_last_, threads_;
  Snapshot snap_;
  std::unique_ptr<Flight> flight_;
};

}  // namespace gpt
