// The answers of a build without the CUDA backend (the .cu twin replaces this file otherwise).
#ifndef LAOYAO_HAVE_CUDA
#include "core/device.hpp"
#include "core/error.hpp"

namespace laoyao {
bool cuda_backend_built() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_device_summary(int) { return {}; }
size_t cuda_device_memory_bytes(int) { return 0; }
void cuda_set_device(int) { throw Error("this laoyao was built without the CUDA backend"); }
}  // namespace laoyao
#endif
