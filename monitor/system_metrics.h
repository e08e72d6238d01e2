// SystemCollector: the trainflow_process_* and trainflow_gpu_* metrics of docs/monitoring.md, read
// when Prometheus scrapes (Collect() runs on the HTTP server's threads, never the training thread).
//
// Process metrics are always present. GPU metrics come from NVML (libnvidia-ml.so.1, or the file
// named by TRAINFLOW_NVML_LIBRARY), loaded at construction for the one GPU requested. A missing
// library, a failing nvmlInit, an unknown GPU or an unsupported query only removes metrics — it is
// never an error; gpu_status() says what happened. Critical XID events are registered at
// construction and counted as each Collect() drains them. The collector owns its NVML session
// (nvmlShutdown on destruction); not copyable.
//
// Thread safety: Collect() and gpu_status() may run concurrently from any threads (NVML's queries
// are thread-safe; the XID event set and its count are guarded by a mutex).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

namespace tf::monitor {

// Which GPU to report. The PCI bus id (cudaDeviceGetPCIBusId: "0000:65:00.0") is preferred; the
// NVML index is used when the bus id is empty or unknown to NVML. Neither: no GPU metrics.
struct GpuSelection {
  std::string pci_bus_id;
  int nvml_index = -1;
  bool requested() const { return !pci_bus_id.empty() || nvml_index >= 0; }
};

class SystemCollector : public prometheus::Collectable {
 public:
  explicit SystemCollector(const GpuSelection& gpu = {});
  ~SystemCollector() override;
  SystemCollector(const SystemCollector&) = delete;
  SystemCollector& operator=(const SystemCollector&) = delete;

  std::vector<prometheus::MetricFamily> Collect() const override;
  // "NVML 12.535.104.05 from /usr/lib/.../libnvidia-ml.so.1: GPU 0 (NVIDIA H100 ..., PCI ...)",
  // "no NVML: <why>" or "no GPU requested".
  const std::string& gpu_status() const { return gpu_status_; }

 private:
  struct Nvml;  // the loaded library, its entry points and the device; null: no GPU metrics
  void CollectGpu(std::vector<prometheus::MetricFamily>* out) const;

  std::unique_ptr<Nvml> nvml_;
  std::string gpu_status_;
  double start_time_s_ = 0;
  mutable std::mutex xid_mu_;        // guards the event set's draining and xid_total_
  mutable uint64_t xid_total_ = 0;
};

// The process's resident set size in bytes, from one read of /proc/self/statm (no allocation);
// -1 when it cannot be read. Cheap enough for once per training step.
int64_t ResidentBytes();
// The largest resident set size this process has had (getrusage ru_maxrss), bytes; -1 when unknown.
int64_t PeakResidentBytes();

}  // namespace tf::monitor
