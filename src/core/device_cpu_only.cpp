// The answers of a build without the CUDA backend (the .cu twin replaces this file otherwise).
#ifndef LAOYAO_HAVE_CUDA
#include "core/device.hpp"

namespace laoyao {
bool cuda_backend_built() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_device_summary(int) { return {}; }
}  // namespace laoyao
#endif
