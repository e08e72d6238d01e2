// A fake libnvidia-ml for system_metrics_test, built as a shared library and loaded through
// TRAINFLOW_NVML_LIBRARY. It exports the NVML entry points SystemCollector uses (signatures checked
// against monitor/nvml_api.h) for FAKE_NVML_DEVICES devices (default 1, at most 8), "Fake GPU" at
// PCI 00000000:65:00.0 for NVML index 0 (the others are reached by index only), each with
// fixed values: 80 GiB memory (20 GiB used), 75% utilisation, 55 C, 300 W, SM 1980 MHz, memory
// 2619 MHz. Controls, read at each call from the environment:
//   FAKE_NVML_INIT_FAIL=1  nvmlInit_v2 fails (driver not loaded)
//   FAKE_NVML_ECC=1        ECC counts are 3 corrected, 1 uncorrected (else: not supported)
//   FAKE_NVML_XID=K        K critical XID events have happened in total: each nvmlEventSetWait_v2
//                          delivers one not yet delivered, then times out
// fake_nvml_init_count() (not NVML) reports nvmlInit_v2 calls not yet matched by nvmlShutdown.
// Thread safety: all state is atomic; setenv the controls only while no collector is scraping.
#include <strings.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "monitor/nvml_api.h"

namespace nvml = tf::monitor::nvml;

namespace {

std::atomic<int> g_init_count{0};
std::atomic<long> g_xid_delivered{0};
std::atomic<int> g_event_sets{0};
constexpr int kMaxDevices = 8;
int g_device_tags[kMaxDevices] = {};
int g_event_set_tag = 0;
nvml::Device DeviceAt(int i) { return reinterpret_cast<nvml::Device>(&g_device_tags[i]); }
nvml::Device const kDevice = DeviceAt(0);
nvml::EventSet const kEventSet = reinterpret_cast<nvml::EventSet>(&g_event_set_tag);
constexpr unsigned long long kGiB = 1ULL << 30;

long EnvLong(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtol(v, nullptr, 10) : 0;
}

nvml::Return CopyString(const char* s, char* out, unsigned int length) {
  if (out == nullptr) return nvml::kErrorInvalidArgument;
  if (std::strlen(s) + 1 > length) return nvml::kErrorInsufficientSize;
  std::strcpy(out, s);
  return nvml::kSuccess;
}

int NumDevices() {
  const long n = EnvLong("FAKE_NVML_DEVICES");
  return n < 1 ? 1 : (n > kMaxDevices ? kMaxDevices : static_cast<int>(n));
}

// The device's index, or -1.
int IndexOf(nvml::Device device) {
  for (int i = 0; i < NumDevices(); ++i) {
    if (device == DeviceAt(i)) return i;
  }
  return -1;
}

// The checks every device query makes, in NVML's order.
nvml::Return CheckDevice(nvml::Device device, const void* out) {
  if (g_init_count.load() <= 0) return nvml::kErrorUninitialized;
  if (IndexOf(device) < 0 || out == nullptr) return nvml::kErrorInvalidArgument;
  return nvml::kSuccess;
}

}  // namespace

extern "C" {

nvml::Return nvmlInit_v2() {
  if (EnvLong("FAKE_NVML_INIT_FAIL") != 0) return nvml::kErrorDriverNotLoaded;
  if (g_init_count.fetch_add(1) == 0) g_xid_delivered = 0;
  return nvml::kSuccess;
}

nvml::Return nvmlShutdown() {
  int n = g_init_count.load();
  do {
    if (n <= 0) return nvml::kErrorUninitialized;
  } while (!g_init_count.compare_exchange_weak(n, n - 1));
  return nvml::kSuccess;
}

const char* nvmlErrorString(nvml::Return r) {
  switch (r) {
    case nvml::kSuccess: return "Success";
    case nvml::kErrorUninitialized: return "Uninitialized";
    case nvml::kErrorInvalidArgument: return "Invalid Argument";
    case nvml::kErrorNotSupported: return "Not Supported";
    case nvml::kErrorNotFound: return "Not Found";
    case nvml::kErrorInsufficientSize: return "Insufficient Size";
    case nvml::kErrorDriverNotLoaded: return "Driver Not Loaded";
    case nvml::kErrorTimeout: return "Timeout";
    default: return "Unknown Error";
  }
}

nvml::Return nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  return CopyString("535.104.05", version, length);
}

nvml::Return nvmlSystemGetNVMLVersion(char* version, unsigned int length) {
  return CopyString("12.535.104.05", version, length);
}

nvml::Return nvmlDeviceGetCount_v2(unsigned int* count) {
  if (g_init_count.load() <= 0) return nvml::kErrorUninitialized;
  if (count == nullptr) return nvml::kErrorInvalidArgument;
  *count = static_cast<unsigned int>(NumDevices());
  return nvml::kSuccess;
}

nvml::Return nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvml::Device* device) {
  if (g_init_count.load() <= 0) return nvml::kErrorUninitialized;
  if (index >= static_cast<unsigned int>(NumDevices()) || device == nullptr) return nvml::kErrorInvalidArgument;
  *device = DeviceAt(static_cast<int>(index));
  return nvml::kSuccess;
}

nvml::Return nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, nvml::Device* device) {
  if (g_init_count.load() <= 0) return nvml::kErrorUninitialized;
  if (bus_id == nullptr || device == nullptr) return nvml::kErrorInvalidArgument;
  // NVML accepts the 4- and 8-digit domain forms, in either case.
  if (strcasecmp(bus_id, "0000:65:00.0") != 0 && strcasecmp(bus_id, "00000000:65:00.0") != 0) {
    return nvml::kErrorNotFound;
  }
  *device = kDevice;
  return nvml::kSuccess;
}

nvml::Return nvmlDeviceGetIndex(nvml::Device device, unsigned int* index) {
  if (nvml::Return r = CheckDevice(device, index); r != nvml::kSuccess) return r;
  *index = static_cast<unsigned int>(IndexOf(device));
  return nvml::kSuccess;
}

nvml::Return nvmlDeviceGetName(nvml::Device device, char* name, unsigned int length) {
  if (nvml::Return r = CheckDevice(device, name); r != nvml::kSuccess) return r;
  return CopyString("Fake GPU", name, length);
}

nvml::Return nvmlDeviceGetUtilizationRates(nvml::Device device, nvml::Utilization* u) {
  if (nvml::Return r = CheckDevice(device, u); r != nvml::kSuccess) return r;
  *u = {.gpu = 75, .memory = 40};
  return nvml::kSuccess;
}

nvml::Return nvmlDeviceGetMemoryInfo(nvml::Device device, nvml::Memory* m) {
  if (nvml::Return r = CheckDevice(device, m); r != nvml::kSuccess) return r;
  *m = {.total = 80 * kGiB, .free = 60 * kGiB, .used = 20 * kGiB};
  return nvml::kSuccess;
}

nvml::Return nvmlDeviceGetTemperature(nvml::Device device, int sensor, unsigned int* celsius) {
  if (nvml::Return r = CheckDevice(device, celsius); r != nvml::kSuccess) return r;
  if (sensor != nvml::kTemperatureGpu) return nvml::kErrorInvalidArgument;
  *celsius = 55;
  return nvml::kSuccess;
}

nvml::Return nvmlDeviceGetPowerUsage(nvml::Device device, unsigned int* milliwatts) {
  if (nvml::Return r = CheckDevice(device, milliwatts); r != nvml::kSuccess) return r;
  *milliwatts = 300000;
  return nvml::kSuccess;
}

nvml::Return nvmlDeviceGetClockInfo(nvml::Device device, int clock, unsigned int* mhz) {
  if (nvml::Return r = CheckDevice(device, mhz); r != nvml::kSuccess) return r;
  if (clock == nvml::kClockSm) {
    *mhz = 1980;
  } else if (clock == nvml::kClockMem) {
    *mhz = 2619;
  } else {
    return nvml::kErrorNotSupported;
  }
  return nvml::kSuccess;
}

nvml::Return nvmlDeviceGetTotalEccErrors(nvml::Device device, int error_type, int counter_type,
                                         unsigned long long* count) {
  if (nvml::Return r = CheckDevice(device, count); r != nvml::kSuccess) return r;
  if (EnvLong("FAKE_NVML_ECC") == 0) return nvml::kErrorNotSupported;
  if (counter_type != nvml::kVolatileEcc) return nvml::kErrorNotSupported;
  *count = error_type == nvml::kMemoryErrorCorrected ? 3 : 1;
  return nvml::kSuccess;
}

nvml::Return nvmlEventSetCreate(nvml::EventSet* set) {
  if (g_init_count.load() <= 0) return nvml::kErrorUninitialized;
  if (set == nullptr) return nvml::kErrorInvalidArgument;
  ++g_event_sets;
  *set = kEventSet;
  return nvml::kSuccess;
}

nvml::Return nvmlDeviceRegisterEvents(nvml::Device device, unsigned long long event_types, nvml::EventSet set) {
  if (nvml::Return r = CheckDevice(device, set); r != nvml::kSuccess) return r;
  if (set != kEventSet) return nvml::kErrorInvalidArgument;
  if ((event_types & ~nvml::kEventTypeXidCriticalError) != 0) return nvml::kErrorNotSupported;
  return nvml::kSuccess;
}

nvml::Return nvmlEventSetWait_v2(nvml::EventSet set, nvml::EventData* data, unsigned int /*timeout_ms*/) {
  if (g_init_count.load() <= 0) return nvml::kErrorUninitialized;
  if (set != kEventSet || data == nullptr) return nvml::kErrorInvalidArgument;
  const long happened = EnvLong("FAKE_NVML_XID");
  long delivered = g_xid_delivered.load();
  do {
    if (delivered >= happened) return nvml::kErrorTimeout;
  } while (!g_xid_delivered.compare_exchange_weak(delivered, delivered + 1));
  *data = {.device = kDevice, .event_type = nvml::kEventTypeXidCriticalError, .event_data = 79,
           .gpu_instance_id = 0xFFFFFFFFu, .compute_instance_id = 0xFFFFFFFFu};
  return nvml::kSuccess;
}

nvml::Return nvmlEventSetFree(nvml::EventSet set) {
  if (set != kEventSet) return nvml::kErrorInvalidArgument;
  --g_event_sets;
  return nvml::kSuccess;
}

int fake_nvml_init_count() { return g_init_count.load(); }
int fake_nvml_event_sets() { return g_event_sets.load(); }

}  // extern "C"

static_assert(std::is_same_v<decltype(&nvmlInit_v2), nvml::InitFn>);
static_assert(std::is_same_v<decltype(&nvmlShutdown), nvml::ShutdownFn>);
static_assert(std::is_same_v<decltype(&nvmlErrorString), nvml::ErrorStringFn>);
static_assert(std::is_same_v<decltype(&nvmlSystemGetDriverVersion), nvml::SystemGetVersionFn>);
static_assert(std::is_same_v<decltype(&nvmlSystemGetNVMLVersion), nvml::SystemGetVersionFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetCount_v2), nvml::DeviceGetCountFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetHandleByIndex_v2), nvml::DeviceGetHandleByIndexFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetHandleByPciBusId_v2), nvml::DeviceGetHandleByPciBusIdFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetIndex), nvml::DeviceGetIndexFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetName), nvml::DeviceGetNameFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetUtilizationRates), nvml::DeviceGetUtilizationRatesFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetMemoryInfo), nvml::DeviceGetMemoryInfoFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetTemperature), nvml::DeviceGetTemperatureFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetPowerUsage), nvml::DeviceGetPowerUsageFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetClockInfo), nvml::DeviceGetClockInfoFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetTotalEccErrors), nvml::DeviceGetTotalEccErrorsFn>);
static_assert(std::is_same_v<decltype(&nvmlEventSetCreate), nvml::EventSetCreateFn>);
static_assert(std::is_same_v<decltype(&nvmlDeviceRegisterEvents), nvml::DeviceRegisterEventsFn>);
static_assert(std::is_same_v<decltype(&nvmlEventSetWait_v2), nvml::EventSetWaitFn>);
static_assert(std::is_same_v<decltype(&nvmlEventSetFree), nvml::EventSetFreeFn>);
