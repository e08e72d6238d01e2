#include "monitor/system_metrics.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
#include <utility>

#include <fmt/format.h>

#include "base/clock.h"
#include "base/dynlib.h"
#include "base/status.h"
#include "monitor/nvml_api.h"
#include "monitor/prometheus_util.h"

namespace tf::monitor {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// At most this many events are taken from the XID event set per scrape (a storm cannot stall it).
constexpr int kMaxEventsPerCollect = 1024;

// Reads a small /proc file with one read() into buf (NUL-terminated); its length, or -1.
ssize_t ReadProcFile(const char* path, char* buf, size_t size) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n;
  do {
    n = ::read(fd, buf, size - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n < 0) return -1;
  buf[n] = '\0';
  return n;
}

double TimespecSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Unix time the process started: /proc/self/stat's starttime (field 22, clock ticks since boot)
// placed on the wall clock through CLOCK_BOOTTIME; the current time when /proc cannot say.
double ProcessStartTime() {
  const double now = UnixSeconds();
  char buf[2048];
  const ssize_t n = ReadProcFile("/proc/self/stat", buf, sizeof(buf));
  if (n <= 0) return now;
  // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return now;
  const char* end = buf + n;
  for (int field = 2; field < 22 && p < end; ++field) {
    p = static_cast<const char*>(std::memchr(p, ' ', static_cast<size_t>(end - p)));
    if (p == nullptr) return now;
    ++p;
  }
  unsigned long long ticks = 0;
  if (std::from_chars(p, end, ticks).ec != std::errc()) return now;
  const long hz = sysconf(_SC_CLK_TCK);
  if (hz <= 0) return now;
  const double age = TimespecSeconds(CLOCK_BOOTTIME) - static_cast<double>(ticks) / static_cast<double>(hz);
  return age >= 0 ? now - age : now;
}

double CpuSeconds() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return seconds(ru.ru_utime) + seconds(ru.ru_stime);
}

template <typename Fn>
void ResolveOptional(const DynamicLibrary& lib, Fn* fn, const char* name) {
  *fn = reinterpret_cast<Fn>(lib.Symbol(name));
}

}  // namespace

// The NVML session for one device. Query entry points other than those Open() needs are optional:
// a null one leaves its metric out.
struct SystemCollector::Nvml {
  DynamicLibrary lib;
  nvml::InitFn init = nullptr;
  nvml::ShutdownFn shutdown = nullptr;
  nvml::ErrorStringFn error_string = nullptr;
  nvml::DeviceGetHandleByIndexFn handle_by_index = nullptr;
  nvml::DeviceGetHandleByPciBusIdFn handle_by_pci_bus_id = nullptr;
  nvml::SystemGetVersionFn nvml_version = nullptr;
  nvml::DeviceGetIndexFn device_index = nullptr;
  nvml::DeviceGetNameFn device_name = nullptr;
  nvml::DeviceGetUtilizationRatesFn utilization = nullptr;
  nvml::DeviceGetMemoryInfoFn memory = nullptr;
  nvml::DeviceGetTemperatureFn temperature = nullptr;
  nvml::DeviceGetPowerUsageFn power = nullptr;
  nvml::DeviceGetClockInfoFn clock = nullptr;
  nvml::DeviceGetTotalEccErrorsFn ecc = nullptr;
  nvml::EventSetCreateFn event_set_create = nullptr;
  nvml::DeviceRegisterEventsFn register_events = nullptr;
  nvml::EventSetWaitFn event_set_wait = nullptr;
  nvml::EventSetFreeFn event_set_free = nullptr;

  bool initialized = false;
  nvml::Device device = nullptr;
  nvml::EventSet events = nullptr;  // null: XID events are not counted
  std::string gpu_label;            // the value of the gpu="..." label
  std::string description;          // gpu_status() when open

  Nvml() = default;
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  ~Nvml() {
    if (events != nullptr) event_set_free(events);
    if (initialized) shutdown();
  }

  std::string Error(nvml::Return r) const {
    const char* s = error_string(r);
    return s != nullptr ? fmt::format("{} ({})", s, r) : fmt::format("NVML error {}", r);
  }

  Status Resolve(const DynamicLibrary& l);
  Status Open(const GpuSelection& gpu);
  void RegisterXidEvents(std::string* note);
};

Status SystemCollector::Nvml::Resolve(const DynamicLibrary& l) {
  TF_RETURN_IF_ERROR(l.Resolve(&init, "nvmlInit_v2"));
  TF_RETURN_IF_ERROR(l.Resolve(&shutdown, "nvmlShutdown"));
  TF_RETURN_IF_ERROR(l.Resolve(&error_string, "nvmlErrorString"));
  TF_RETURN_IF_ERROR(l.Resolve(&handle_by_index, "nvmlDeviceGetHandleByIndex_v2"));
  TF_RETURN_IF_ERROR(l.Resolve(&handle_by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2"));
  ResolveOptional(l, &nvml_version, "nvmlSystemGetNVMLVersion");
  ResolveOptional(l, &device_index, "nvmlDeviceGetIndex");
  ResolveOptional(l, &device_name, "nvmlDeviceGetName");
  ResolveOptional(l, &utilization, "nvmlDeviceGetUtilizationRates");
  ResolveOptional(l, &memory, "nvmlDeviceGetMemoryInfo");
  ResolveOptional(l, &temperature, "nvmlDeviceGetTemperature");
  ResolveOptional(l, &power, "nvmlDeviceGetPowerUsage");
  ResolveOptional(l, &clock, "nvmlDeviceGetClockInfo");
  ResolveOptional(l, &ecc, "nvmlDeviceGetTotalEccErrors");
  ResolveOptional(l, &event_set_create, "nvmlEventSetCreate");
  ResolveOptional(l, &register_events, "nvmlDeviceRegisterEvents");
  ResolveOptional(l, &event_set_wait, "nvmlEventSetWait_v2");
  ResolveOptional(l, &event_set_free, "nvmlEventSetFree");
  return Status::OK();
}

Status SystemCollector::Nvml::Open(const GpuSelection& gpu) {
  LibrarySearch search{.name = "libnvidia-ml.so.1",
                       .override_env = "TRAINFLOW_NVML_LIBRARY",
                       // A driver library: on the loader's path (WSL keeps it apart), never in CUDA_HOME.
                       .candidates = {"libnvidia-ml.so.1", "/usr/lib/wsl/lib/libnvidia-ml.so.1"},
                       .hint = "the NVIDIA driver provides it; TRAINFLOW_NVML_LIBRARY names another"};
  TF_ASSIGN_OR_RETURN(lib, LoadLibrary(search, [this](const DynamicLibrary& l) { return Resolve(l); }));
  if (const nvml::Return r = init(); r != nvml::kSuccess) {
    return Status::Unavailable("nvmlInit failed in {}: {}", lib.path(), Error(r));
  }
  initialized = true;

  std::string how;
  if (!gpu.pci_bus_id.empty()) {
    if (const nvml::Return r = handle_by_pci_bus_id(gpu.pci_bus_id.c_str(), &device); r != nvml::kSuccess) {
      device = nullptr;
      how = fmt::format("PCI bus id {}: {}", gpu.pci_bus_id, Error(r));
    }
  }
  if (device == nullptr && gpu.nvml_index >= 0) {
    const nvml::Return r = handle_by_index(static_cast<unsigned int>(gpu.nvml_index), &device);
    if (r != nvml::kSuccess) {
      device = nullptr;
      how += fmt::format("{}NVML index {}: {}", how.empty() ? "" : "; ", gpu.nvml_index, Error(r));
    } else if (!how.empty()) {
      how = fmt::format("by NVML index {} ({})", gpu.nvml_index, how);
    }
  }
  if (device == nullptr) return Status::NotFound("no such GPU in {}: {}", lib.path(), how);

  unsigned int index = 0;
  if (device_index != nullptr && device_index(device, &index) == nvml::kSuccess) {
    gpu_label = std::to_string(index);
  } else {
    gpu_label = std::to_string(gpu.nvml_index >= 0 ? gpu.nvml_index : 0);
  }
  char version[nvml::kVersionBufferSize] = "unknown version";
  if (nvml_version != nullptr && nvml_version(version, sizeof(version)) != nvml::kSuccess) {
    std::strcpy(version, "unknown version");
  }
  char name[nvml::kNameBufferSize] = "unknown";
  if (device_name != nullptr && device_name(device, name, sizeof(name)) != nvml::kSuccess) std::strcpy(name, "unknown");
  const std::string found = how.empty() ? "PCI " + gpu.pci_bus_id : how;
  description = fmt::format("NVML {} from {}: GPU {} ({}{})", version, lib.path(), gpu_label, name,
                            gpu.pci_bus_id.empty() ? "" : ", " + found);
  std::string note;
  RegisterXidEvents(&note);
  if (!note.empty()) description += "; " + note;
  return Status::OK();
}

void SystemCollector::Nvml::RegisterXidEvents(std::string* note) {
  if (event_set_create == nullptr || register_events == nullptr || event_set_wait == nullptr ||
      event_set_free == nullptr) {
    *note = "XID events not counted: this NVML lacks the event API";
    return;
  }
  nvml::EventSet set = nullptr;
  if (const nvml::Return r = event_set_create(&set); r != nvml::kSuccess) {
    *note = "XID events not counted: nvmlEventSetCreate: " + Error(r);
    return;
  }
  if (const nvml::Return r = register_events(device, nvml::kEventTypeXidCriticalError, set); r != nvml::kSuccess) {
    event_set_free(set);
    *note = "XID events not counted: nvmlDeviceRegisterEvents: " + Error(r);
    return;
  }
  events = set;
}

SystemCollector::SystemCollector(const GpuSelection& gpu) : start_time_s_(ProcessStartTime()) {
  if (!gpu.requested()) {
    gpu_status_ = "no GPU requested";
    return;
  }
  auto n = std::make_unique<Nvml>();
  if (Status s = n->Open(gpu); !s.ok()) {
    gpu_status_ = "no NVML: " + s.message();
    return;  // n's destructor shuts NVML down if it was initialised
  }
  gpu_status_ = n->description;
  nvml_ = std::move(n);
}

SystemCollector::~SystemCollector() = default;

std::vector<MetricFamily> SystemCollector::Collect() const {
  std::vector<MetricFamily> out;
  if (const int64_t rss = ResidentBytes(); rss >= 0) {
    out.push_back(Single("trainflow_process_resident_memory_bytes", "Resident set size of the process in bytes.",
                         MetricType::Gauge, static_cast<double>(rss)));
  }
  if (const int64_t peak = PeakResidentBytes(); peak >= 0) {
    out.push_back(Single("trainflow_process_peak_resident_memory_bytes",
                         "Largest resident set size the process has had, in bytes.", MetricType::Gauge,
                         static_cast<double>(peak)));
  }
  if (const double cpu = CpuSeconds(); cpu >= 0) {
    out.push_back(Single("trainflow_process_cpu_seconds_total", "User and system CPU time of the process in seconds.",
                         MetricType::Counter, cpu));
  }
  out.push_back(Single("trainflow_process_start_time_seconds", "Unix time the process started, in seconds.",
                       MetricType::Gauge, start_time_s_));
  if (nvml_ != nullptr) CollectGpu(&out);
  return out;
}

void SystemCollector::CollectGpu(std::vector<MetricFamily>* out) const {
  const Nvml& n = *nvml_;
  const std::vector<ClientMetric::Label> gpu{{"gpu", n.gpu_label}};
  auto gauge = [&](const char* name, const char* help, double value) {
    out->push_back(Single(name, help, MetricType::Gauge, value, gpu));
  };
  // A query answers when this NVML has it and it succeeds (not NVML_ERROR_NOT_SUPPORTED, ...).
  auto ok = [&n](auto fn, auto... args) { return fn != nullptr && fn(n.device, args...) == nvml::kSuccess; };
  if (nvml::Utilization u{}; ok(n.utilization, &u)) {
    gauge("trainflow_gpu_utilization_ratio", "Fraction of the last sample period in which a kernel ran (0-1).",
          u.gpu / 100.0);
  }
  if (nvml::Memory m{}; ok(n.memory, &m)) {
    gauge("trainflow_gpu_memory_used_bytes", "GPU memory in use in bytes.", static_cast<double>(m.used));
    gauge("trainflow_gpu_memory_total_bytes", "GPU memory in bytes.", static_cast<double>(m.total));
  }
  if (unsigned int c = 0; ok(n.temperature, nvml::kTemperatureGpu, &c)) {
    gauge("trainflow_gpu_temperature_celsius", "GPU die temperature in degrees Celsius.", c);
  }
  if (unsigned int mw = 0; ok(n.power, &mw)) {
    gauge("trainflow_gpu_power_watts", "GPU power draw in watts.", mw / 1000.0);
  }
  if (unsigned int mhz = 0; ok(n.clock, nvml::kClockSm, &mhz)) {
    gauge("trainflow_gpu_sm_clock_hertz", "GPU SM clock in hertz.", mhz * 1e6);
  }
  if (unsigned int mhz = 0; ok(n.clock, nvml::kClockMem, &mhz)) {
    gauge("trainflow_gpu_memory_clock_hertz", "GPU memory clock in hertz.", mhz * 1e6);
  }
  if (n.ecc != nullptr) {
    MetricFamily f = Family("trainflow_gpu_ecc_errors_total",
                            "GPU memory ECC errors since the driver loaded (volatile counts), by type.",
                            MetricType::Counter);
    for (const auto& [type, name] : {std::pair{nvml::kMemoryErrorCorrected, "corrected"},
                                     std::pair{nvml::kMemoryErrorUncorrected, "uncorrected"}}) {
      if (unsigned long long count = 0; ok(n.ecc, type, nvml::kVolatileEcc, &count)) {
        AddSample(&f, static_cast<double>(count), {{"gpu", n.gpu_label}, {"type", name}});
      }
    }
    if (!f.metric.empty()) out->push_back(std::move(f));
  }
  if (n.events != nullptr) {
    std::lock_guard<std::mutex> lock(xid_mu_);
    for (int i = 0; i < kMaxEventsPerCollect; ++i) {
      nvml::EventData e{};
      if (n.event_set_wait(n.events, &e, 0) != nvml::kSuccess) break;  // kErrorTimeout: drained
      if ((e.event_type & nvml::kEventTypeXidCriticalError) != 0) ++xid_total_;
    }
    out->push_back(Single("trainflow_gpu_xid_errors_total", "Critical XID events NVML reported since start.",
                          MetricType::Counter, static_cast<double>(xid_total_), gpu));
  }
}

int64_t PeakResidentBytes() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return -1;
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // KiB on Linux
}

int64_t ResidentBytes() {
  char buf[160];
  const ssize_t n = ReadProcFile("/proc/self/statm", buf, sizeof(buf));
  if (n <= 0) return -1;
  // "size resident shared text lib data dt", in pages: the second field.
  const char* end = buf + n;
  const char* p = static_cast<const char*>(std::memchr(buf, ' ', static_cast<size_t>(n)));
  if (p == nullptr) return -1;
  int64_t pages = 0;
  if (std::from_chars(p + 1, end, pages).ec != std::errc()) return -1;
  static const int64_t page_size = sysconf(_SC_PAGESIZE);
  return pages * page_size;
}

}  // namespace tf::monitor
