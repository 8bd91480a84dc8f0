// Checkpoints written in the background. start() queues the copies of this rank's state into host memory
// (a consistent snapshot at a step boundary, io/snapshot.hpp), lays out its file with HDF5 on the calling
// (main) thread, and hands the rest to a writer thread: it waits for the copies, then pwrites the
// datasets' bytes on several threads, hashing each range for the MANIFEST as it goes, and fsyncs.
// Training goes on meanwhile; no MPI and no HDF5 are called off the main thread. finish(),
// at the same point on every rank, agrees on every rank's outcome and publishes (io/checkpoint.hpp's
// protocol: MANIFEST last, rename, `latest`, keep_last), or removes the .tmp folder of a failed write.
// At most one checkpoint is in flight, and its snapshot buffers are reused by the next.
// A run that fails calls finish() too (with a bound on how long the write may go without progress), so
// that a write that completes is published rather than left a .tmp folder.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
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
  bool reserve(ShardedState& e, const ParamLayout& layout);
  // Collective: snapshot, layout, and the background write started (nothing may be in flight: finish()
  // first). before_write runs on the writer thread first (a testing hook); with `late` (another) the
  // writer thread writes nothing until this rank waits for it (wait_here or finish). A failure here is
  // agreed.
  void start(const TrainState& st, ShardedState& engine, const ParamLayout& layout,
             std::function<void()> before_write = {}, bool late = false);
  bool in_flight() const { return flight_ != nullptr; }
  // This rank's background write still runs (the trainer's step boundary agrees on it across ranks).
  bool busy_here() const { return flight_ && !flight_->done.load(std::memory_order_acquire); }
  // Waits for this rank's write alone: nothing agreed, nothing published (that is finish()'s).
  void wait_here();
  // Collective: waits for this rank's write, then publishes, or throws the AgreedError of a failed one.
  // With stall_s > 0 the wait lasts as long as the write makes progress: a write that has written no
  // byte for stall_s seconds is given up (a failure like any other; its thread, stuck in the system,
  // is left to the process's end with the memory it writes from, and no checkpoint may start after it:
  // for a run on its way out). The final fsync shows no progress.
  CheckpointOutcome finish(double stall_s = 0);
  size_t snapshot_bytes() const { return snap_ ? snap_->bytes() : 0; }

 private:
  struct Flight {
    int64_t step = 0;
    std::string tmp;
    Snapshot::Copies copies;         // landed by the writer thread before it writes the regions
    std::vector<Region> regions;     // where in the file each dataset's bytes go, from where they will land
    std::function<void()> before_write;
    bool late = false;
    std::thread thread;
    std::mutex m;                   // with cv: `wanted` for the writer thread, `done` for the waiter
    std::condition_variable cv;
    bool wanted = false;            // this rank waits for the write (a late one starts only then)
    std::atomic<bool> done{false};
    std::atomic<uint64_t> written{0};  // bytes written so far: the progress a waiter watches
    std::string error;  // set by the writer thread before done
    FileDigest digest;
    std::chrono::steady_clock::time_point t0;
    double stall_s = 0, written_s = 0;  // written_s: set by the writer thread before done
  };
  void write(Flight& f);  // the writer thread
  // Waits for f's write while it makes progress (stall_s <= 0: however long it takes); false when it
  // wrote nothing for stall_s seconds.
  static bool wait(Flight& f, double stall_s);

  const std::string run_dir_;
  HostComm& host_;
  const int keep_last_, threads_;
  std::unique_ptr<Snapshot> snap_;  // given up with a stuck write (its thread may still read it)
  std::unique_ptr<Flight> flight_;
};

}  // namespace gpt
