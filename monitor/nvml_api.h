// The part of NVML's C API (libnvidia-ml.so.1, NVIDIA's nvml.h) that SystemCollector uses, declared
// here so the build needs no nvml.h: the ABI types and constants, and the signature of every entry
// point as a function-pointer type. The collector resolves these symbols at run time; the test's
// fake NVML (tests/monitor/fake_nvml.cpp) defines them and static_asserts that its definitions match.
// Enum parameters are passed as int (C enums are int-sized). Values and layouts follow nvml.h.
#pragma once

namespace tf::monitor::nvml {

using Return = int;  // nvmlReturn_t
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorNotFound = 6;
inline constexpr Return kErrorInsufficientSize = 7;
inline constexpr Return kErrorDriverNotLoaded = 9;
inline constexpr Return kErrorTimeout = 10;

struct DeviceSt;
using Device = DeviceSt*;  // nvmlDevice_t
struct EventSetSt;
using EventSet = EventSetSt*;  // nvmlEventSet_t

struct Utilization {  // nvmlUtilization_t: percentages over the driver's last sample period
  unsigned int gpu, memory;
};
struct Memory {  // nvmlMemory_t: bytes
  unsigned long long total, free, used;
};
struct EventData {  // nvmlEventData_t, as nvmlEventSetWait_v2 fills it
  Device device;
  unsigned long long event_type;
  unsigned long long event_data;  // the XID for an XID event
  unsigned int gpu_instance_id, compute_instance_id;
};

inline constexpr int kTemperatureGpu = 0;       // nvmlTemperatureSensors_t
inline constexpr int kClockSm = 1;              // nvmlClockType_t
inline constexpr int kClockMem = 2;
inline constexpr int kMemoryErrorCorrected = 0;  // nvmlMemoryErrorType_t
inline constexpr int kMemoryErrorUncorrected = 1;
inline constexpr int kVolatileEcc = 0;          // nvmlEccCounterType_t
inline constexpr unsigned long long kEventTypeXidCriticalError = 0x8ULL;
inline constexpr unsigned int kVersionBufferSize = 80;  // NVML_SYSTEM_*_VERSION_BUFFER_SIZE
inline constexpr unsigned int kNameBufferSize = 96;     // NVML_DEVICE_NAME_V2_BUFFER_SIZE

using InitFn = Return (*)();                                       // nvmlInit_v2
using ShutdownFn = Return (*)();                                   // nvmlShutdown
using ErrorStringFn = const char* (*)(Return);                     // nvmlErrorString
using SystemGetVersionFn = Return (*)(char*, unsigned int);        // nvmlSystemGet{Driver,NVML}Version
using DeviceGetCountFn = Return (*)(unsigned int*);                // nvmlDeviceGetCount_v2
using DeviceGetHandleByIndexFn = Return (*)(unsigned int, Device*);     // nvmlDeviceGetHandleByIndex_v2
using DeviceGetHandleByPciBusIdFn = Return (*)(const char*, Device*);   // ..._ByPciBusId_v2
using DeviceGetIndexFn = Return (*)(Device, unsigned int*);        // nvmlDeviceGetIndex
using DeviceGetNameFn = Return (*)(Device, char*, unsigned int);   // nvmlDeviceGetName
using DeviceGetUtilizationRatesFn = Return (*)(Device, Utilization*);
using DeviceGetMemoryInfoFn = Return (*)(Device, Memory*);
using DeviceGetTemperatureFn = Return (*)(Device, int sensor, unsigned int* celsius);
using DeviceGetPowerUsageFn = Return (*)(Device, unsigned int* milliwatts);
using DeviceGetClockInfoFn = Return (*)(Device, int clock, unsigned int* mhz);
using DeviceGetTotalEccErrorsFn = Return (*)(Device, int error_type, int counter_type, unsigned long long*);
using EventSetCreateFn = Return (*)(EventSet*);
using DeviceRegisterEventsFn = Return (*)(Device, unsigned long long event_types, EventSet);
using EventSetWaitFn = Return (*)(EventSet, EventData*, unsigned int timeout_ms);  // nvmlEventSetWait_v2
using EventSetFreeFn = Return (*)(EventSet);

}  // namespace tf::monitor::nvml
