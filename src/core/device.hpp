// What accelerators this process can use. Built without the CUDA backend, there are none.
#pragma once
#include <cstddef>
#include <string>

namespace laoyao {

bool cuda_backend_built();
// Number of visible CUDA devices; 0 when the backend is not built, no driver is present or no
// GPU is visible (never throws: "no GPU" is a normal answer on CPU machines).
int cuda_device_count();
// One line naming device `i` ("NVIDIA H200, cc 9.0, 132 SMs, 139.8 GiB"), or "" if unavailable.
std::string cuda_device_summary(int i);
// Device i's memory in bytes (0 when unknown or without the CUDA backend).
size_t cuda_device_memory_bytes(int i);
// Makes device `i` this process's current device (a GPU rank's own, LOCAL_RANK); throws
// laoyao::Error when it cannot.
void cuda_set_device(int i);

}  // namespace laoyao
