// A parallel loop over independent tasks that may fail (chunk encoding and upload, multipart
// parts): plain threads started for the call, for work that waits on I/O as much as it computes
// (OpenMP's pool is the training step's). Thread-safe to call from any thread.
#pragma once
#include <cstddef>
#include <functional>

#include "base/status.h"

namespace tf {

// Runs task(i, worker) for every i in [0, n) on min(threads, n) threads: the calling thread is
// worker 0, threads started for the call are workers 1, 2, ...; each takes the next index until
// none is left. Once a task fails no further task starts. Returns the failure of the lowest index
// that failed (OK when none did) after every thread has finished.
// REQUIRES: task is safe to call concurrently for different i.
Status ParallelFor(size_t n, size_t threads, const std::function<Status(size_t i, size_t worker)>& task);

}  // namespace tf
