// Clocks as seconds in a double, and UTC time strings. Monotonic time measures intervals and
// deadlines (never goes back); Unix time stamps records and files. Thread-safe.
#pragma once
#include <string>

namespace tf {

// Seconds on the monotonic clock (std::chrono::steady_clock), from an arbitrary origin.
double MonotonicSeconds();
// Seconds since the Unix epoch on the wall clock.
double UnixSeconds();
// unix_s in UTC through strftime's `format` ("%Y%m%d-%H%M%S"); at most 127 characters.
std::string FormatUtc(double unix_s, const char* format);
// ISO 8601 UTC to the second: "2026-12-06T03:10:52Z".
std::string IsoUtc(double unix_s);
// ISO 8601 UTC to the millisecond: "2026-12-06T03:10:52.125Z".
std::string IsoUtcMillis(double unix_s);

}  // namespace tf
