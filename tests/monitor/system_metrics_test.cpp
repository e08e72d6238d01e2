// SystemCollector: process metrics, their exposition, and the GPU metrics against no NVML and
// against the fake NVML of tests/monitor/fake_nvml.cpp (its path in TF_FAKE_NVML).
#include "monitor/system_metrics.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

namespace tf::monitor {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

// Sets an environment variable for the scope (unset: value nullptr), restoring the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    Set(value);
  }
  ~ScopedEnv() { Set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void Set(const char* value) {
    if (value != nullptr) {
      setenv(name_.c_str(), value, 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

const MetricFamily* Find(const std::vector<MetricFamily>& families, const std::string& name) {
  for (const MetricFamily& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// The single sample's value of `name` (a gauge's or a counter's); nullopt when absent.
std::optional<double> Value(const std::vector<MetricFamily>& families, const std::string& name) {
  const MetricFamily* f = Find(families, name);
  if (f == nullptr || f->metric.size() != 1) return std::nullopt;
  return f->type == MetricType::Counter ? f->metric[0].counter.value : f->metric[0].gauge.value;
}

bool HasGpuMetrics(const std::vector<MetricFamily>& families) {
  return std::any_of(families.begin(), families.end(),
                     [](const MetricFamily& f) { return f.name.rfind("trainflow_gpu_", 0) == 0; });
}

std::string Exposition(const std::vector<MetricFamily>& families) {
  return prometheus::TextSerializer().Serialize(families);
}

double CpuSecondsBusy(double seconds) {
  const std::clock_t start = std::clock();
  volatile double x = 1;
  while (static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC < seconds) x = x * 1.0000001 + 1e-9;
  return x;
}

TEST(ResidentBytesTest, GrowsWithTouchedMemory) {
  const int64_t before = ResidentBytes();
  ASSERT_GT(before, 0);
  constexpr size_t kBytes = 64 << 20;
  std::vector<char> block(kBytes);
  for (size_t i = 0; i < kBytes; i += 4096) block[i] = static_cast<char>(i);
  const int64_t after = ResidentBytes();
  EXPECT_GE(after - before, static_cast<int64_t>(kBytes) * 9 / 10) << before << " -> " << after;
}

TEST(SystemCollectorTest, ProcessMetricsAreSane) {
  SystemCollector collector;
  EXPECT_EQ(collector.gpu_status(), "no GPU requested");
  const auto first = collector.Collect();
  EXPECT_FALSE(HasGpuMetrics(first));

  const auto rss = Value(first, "trainflow_process_resident_memory_bytes");
  ASSERT_TRUE(rss.has_value());
  const double resident = static_cast<double>(ResidentBytes());
  EXPECT_GT(*rss, 0);
  EXPECT_NEAR(*rss, resident, 0.1 * resident + (16 << 20));

  const auto start = Value(first, "trainflow_process_start_time_seconds");
  ASSERT_TRUE(start.has_value());
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(*start, now + 1);
  EXPECT_GT(*start, now - 3600);

  const auto cpu0 = Value(first, "trainflow_process_cpu_seconds_total");
  ASSERT_TRUE(cpu0.has_value());
  EXPECT_GT(*cpu0, 0);
  CpuSecondsBusy(0.2);
  const auto cpu1 = Value(collector.Collect(), "trainflow_process_cpu_seconds_total");
  ASSERT_TRUE(cpu1.has_value());
  EXPECT_GE(*cpu1 - *cpu0, 0.15);
  EXPECT_EQ(Value(collector.Collect(), "trainflow_process_start_time_seconds"), start);
}

TEST(SystemCollectorTest, ExpositionHasHelpAndType) {
  const std::string text = Exposition(SystemCollector().Collect());
  for (const char* line : {"# TYPE trainflow_process_resident_memory_bytes gauge\n",
                           "# TYPE trainflow_process_cpu_seconds_total counter\n",
                           "# TYPE trainflow_process_start_time_seconds gauge\n",
                           "# HELP trainflow_process_resident_memory_bytes Resident set size",
                           "# HELP trainflow_process_cpu_seconds_total User and system CPU time",
                           "# HELP trainflow_process_start_time_seconds Unix time the process started"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
  EXPECT_EQ(text.find("trainflow_gpu_"), std::string::npos) << text;
}

TEST(SystemCollectorTest, MissingNvmlLeavesGpuMetricsOut) {
  ScopedEnv lib("TRAINFLOW_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
  SystemCollector collector(GpuSelection{.pci_bus_id = "0000:65:00.0", .nvml_index = 0});
  const auto families = collector.Collect();
  EXPECT_FALSE(HasGpuMetrics(families));
  EXPECT_TRUE(Value(families, "trainflow_process_resident_memory_bytes").has_value());
  EXPECT_EQ(collector.gpu_status().rfind("no NVML: ", 0), 0u) << collector.gpu_status();
  EXPECT_NE(collector.gpu_status().find("TRAINFLOW_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1"), std::string::npos)
      << collector.gpu_status();
}

#if defined(TF_FAKE_NVML)

// The fake's own counters, read through a second handle on the same loaded library.
class FakeNvml {
 public:
  FakeNvml() : handle_(dlopen(TF_FAKE_NVML, RTLD_NOW | RTLD_LOCAL)) {
    if (handle_ == nullptr) return;
    init_count_ = reinterpret_cast<int (*)()>(dlsym(handle_, "fake_nvml_init_count"));
    event_sets_ = reinterpret_cast<int (*)()>(dlsym(handle_, "fake_nvml_event_sets"));
  }
  ~FakeNvml() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  FakeNvml(const FakeNvml&) = delete;
  FakeNvml& operator=(const FakeNvml&) = delete;
  bool ok() const { return init_count_ != nullptr && event_sets_ != nullptr; }
  int init_count() const { return init_count_(); }
  int event_sets() const { return event_sets_(); }

 private:
  void* handle_;
  int (*init_count_)() = nullptr;
  int (*event_sets_)() = nullptr;
};

class FakeNvmlTest : public ::testing::Test {
 protected:
  ScopedEnv lib_{"TRAINFLOW_NVML_LIBRARY", TF_FAKE_NVML};
  ScopedEnv xid_{"FAKE_NVML_XID", nullptr};
  ScopedEnv ecc_{"FAKE_NVML_ECC", nullptr};
  ScopedEnv init_fail_{"FAKE_NVML_INIT_FAIL", nullptr};
  FakeNvml fake_;
};

TEST_F(FakeNvmlTest, GpuMetricsInBaseUnits) {
  ASSERT_TRUE(fake_.ok()) << dlerror();
  SystemCollector collector(GpuSelection{.pci_bus_id = "0000:65:00.0"});
  EXPECT_EQ(collector.gpu_status(),
            "NVML 12.535.104.05 from " TF_FAKE_NVML ": GPU 0 (Fake GPU, PCI 0000:65:00.0)");
  const auto f = collector.Collect();
  EXPECT_EQ(Value(f, "trainflow_gpu_utilization_ratio"), 0.75);
  EXPECT_EQ(Value(f, "trainflow_gpu_memory_used_bytes"), 20.0 * (1ULL << 30));
  EXPECT_EQ(Value(f, "trainflow_gpu_memory_total_bytes"), 80.0 * (1ULL << 30));
  EXPECT_EQ(Value(f, "trainflow_gpu_temperature_celsius"), 55.0);
  EXPECT_EQ(Value(f, "trainflow_gpu_power_watts"), 300.0);
  EXPECT_EQ(Value(f, "trainflow_gpu_sm_clock_hertz"), 1980e6);
  EXPECT_EQ(Value(f, "trainflow_gpu_memory_clock_hertz"), 2619e6);
  EXPECT_EQ(Value(f, "trainflow_gpu_xid_errors_total"), 0.0);
  EXPECT_EQ(Find(f, "trainflow_gpu_ecc_errors_total"), nullptr) << "the fake's ECC query is not supported";
  for (const MetricFamily& family : f) {
    if (family.name.rfind("trainflow_gpu_", 0) != 0) continue;
    ASSERT_EQ(family.metric.size(), 1u) << family.name;
    ASSERT_EQ(family.metric[0].label.size(), 1u) << family.name;
    EXPECT_EQ(family.metric[0].label[0].name, "gpu");
    EXPECT_EQ(family.metric[0].label[0].value, "0");
  }
  const std::string text = Exposition(f);
  for (const char* line : {"# TYPE trainflow_gpu_power_watts gauge\n",
                           "# TYPE trainflow_gpu_xid_errors_total counter\n",
                           "# HELP trainflow_gpu_memory_used_bytes ",
                           "trainflow_gpu_power_watts{gpu=\"0\"} 300\n",
                           "trainflow_gpu_utilization_ratio{gpu=\"0\"} 0.75\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
}

TEST_F(FakeNvmlTest, EccCountsByType) {
  ecc_.Set("1");
  const auto f = SystemCollector(GpuSelection{.pci_bus_id = {}, .nvml_index = 0}).Collect();
  const MetricFamily* ecc = Find(f, "trainflow_gpu_ecc_errors_total");
  ASSERT_NE(ecc, nullptr);
  EXPECT_EQ(ecc->type, MetricType::Counter);
  const std::string text = Exposition(f);
  EXPECT_NE(text.find("trainflow_gpu_ecc_errors_total{gpu=\"0\",type=\"corrected\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("trainflow_gpu_ecc_errors_total{gpu=\"0\",type=\"uncorrected\"} 1\n"), std::string::npos) << text;
}

TEST_F(FakeNvmlTest, XidEventsAreCountedOnce) {
  SystemCollector collector(GpuSelection{.pci_bus_id = {}, .nvml_index = 0});
  EXPECT_EQ(Value(collector.Collect(), "trainflow_gpu_xid_errors_total"), 0.0);
  xid_.Set("2");
  EXPECT_EQ(Value(collector.Collect(), "trainflow_gpu_xid_errors_total"), 2.0);
  EXPECT_EQ(Value(collector.Collect(), "trainflow_gpu_xid_errors_total"), 2.0);
  xid_.Set("5");
  EXPECT_EQ(Value(collector.Collect(), "trainflow_gpu_xid_errors_total"), 5.0);
}

TEST_F(FakeNvmlTest, UnknownBusIdFallsBackToIndex) {
  SystemCollector by_index(GpuSelection{.pci_bus_id = "0000:17:00.0", .nvml_index = 0});
  EXPECT_TRUE(HasGpuMetrics(by_index.Collect())) << by_index.gpu_status();
  EXPECT_NE(by_index.gpu_status().find("by NVML index 0 (PCI bus id 0000:17:00.0: Not Found"), std::string::npos)
      << by_index.gpu_status();

  SystemCollector nothing(GpuSelection{.pci_bus_id = "0000:17:00.0"});
  EXPECT_FALSE(HasGpuMetrics(nothing.Collect()));
  EXPECT_EQ(nothing.gpu_status().rfind("no NVML: no such GPU", 0), 0u) << nothing.gpu_status();
}

TEST_F(FakeNvmlTest, FailingInitLeavesGpuMetricsOut) {
  ASSERT_TRUE(fake_.ok());
  init_fail_.Set("1");
  SystemCollector collector(GpuSelection{.pci_bus_id = {}, .nvml_index = 0});
  EXPECT_FALSE(HasGpuMetrics(collector.Collect()));
  EXPECT_NE(collector.gpu_status().find("nvmlInit failed"), std::string::npos) << collector.gpu_status();
  EXPECT_NE(collector.gpu_status().find("Driver Not Loaded"), std::string::npos) << collector.gpu_status();
  EXPECT_EQ(fake_.init_count(), 0);
}

TEST_F(FakeNvmlTest, DestructorShutsNvmlDown) {
  ASSERT_TRUE(fake_.ok());
  {
    SystemCollector collector(GpuSelection{.pci_bus_id = {}, .nvml_index = 0});
    EXPECT_EQ(fake_.init_count(), 1);
    EXPECT_EQ(fake_.event_sets(), 1);
    SystemCollector unknown(GpuSelection{.pci_bus_id = "0000:17:00.0"});
    EXPECT_EQ(fake_.init_count(), 1) << "a failed open shuts its session down";
  }
  EXPECT_EQ(fake_.init_count(), 0);
  EXPECT_EQ(fake_.event_sets(), 0);
}

TEST_F(FakeNvmlTest, ConcurrentCollectsCountEveryEventOnce) {
  constexpr int kEvents = 1000;
  xid_.Set(std::to_string(kEvents).c_str());
  SystemCollector collector(GpuSelection{.pci_bus_id = "00000000:65:00.0"});
  std::vector<std::thread> threads;
  std::vector<double> last(8, -1);
  for (size_t t = 0; t < last.size(); ++t) {
    threads.emplace_back([&collector, &last, t] {
      for (int i = 0; i < 50; ++i) {
        const auto f = collector.Collect();
        const auto xid = Value(f, "trainflow_gpu_xid_errors_total");
        if (!xid || !Value(f, "trainflow_gpu_power_watts") || *xid < last[t]) return;
        last[t] = *xid;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (double v : last) EXPECT_EQ(v, kEvents);
}

#endif  // TF_FAKE_NVML

}  // namespace
}  // namespace tf::monitor
