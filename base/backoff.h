// Delays between retries: exponential growth to a cap, and full jitter (a uniform draw below the
// delay, so that many clients retrying at once spread out). Thread-safe.
#pragma once

namespace tf {

// base_s * factor^k, at most max_s. k >= 0; factor >= 1. Stops growing at the cap (no overflow
// for any k).
double ExponentialDelay(double base_s, double factor, int k, double max_s);
// Uniform in [0, max(d, 0)], from a generator of the calling thread's own.
double FullJitter(double d);

}  // namespace tf
