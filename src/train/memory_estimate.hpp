// A lower bound on the memory one rank of a run needs, checked before anything is allocated, so
// that an absurd size (--hidden-size 1048576, --micro-batch-size 1000000000, --train-iters 1e11)
// is refused with a message naming the settings that drive it, not ended by std::bad_alloc (or
// the machine's swap) half-way through building the model or the datasets.
//
// Each term counts only what the run certainly holds, so a config that fits is never refused:
//   state       = P x (w + 4 + (m + o) / shards)   bytes: P parameters on this rank (the dense
//                 ones over TP, the routed experts' over EP x ETP), w = 2 for half-precision
//                 weights on the CUDA backend else 4, fp32 gradients (4), an fp32 main copy
//                 m = 4 beside half-precision weights, optimizer state o = 8 (Adam) or 4 (SGD
//                 with momentum), sharded over the world with the distributed optimizer; with
//                 PEFT the frozen base counts its weights alone (w) and the adapters nothing;
//   activations = one micro-batch: each layer's input, b x s x h values (over TP with sequence
//                 parallelism), the CPU backend's attention probabilities, b x heads/TP x s x s
//                 floats a layer, and the logits, b x s x V/TP values;
//   indices     = the GPT datasets' sample and shuffle indices, 24 bytes a sample of the train,
//                 validation and test budgets (none for the fine-tuning datasets).
// A term alone, or their sum, larger than the memory that holds it is a UsageError: on the CUDA
// backend the state and activations are the GPU's, the indices the host's.
#pragma once
#include "config/config_container.hpp"
#include "config/validate.hpp"

namespace laoyao::train {

struct MemoryEstimate {
  long double parameters = 0;       // on this rank
  long double bytes_per_parameter = 0;
  long double state_bytes = 0;      // parameters x bytes_per_parameter
  long double activation_bytes = 0; // one micro-batch
  long double index_bytes = 0;      // the datasets' indices
  long double total() const { return state_bytes + activation_bytes + index_bytes; }
};

// c, d: a validated config with its padded vocabulary known; cuda: the backend the run uses.
MemoryEstimate estimate_memory(const config::ConfigContainer& c, const config::Derived& d, bool cuda);

// The host's physical memory in bytes (sysconf), 0 when unknown.
long double physical_memory_bytes();
// This process's peak resident memory so far in bytes (getrusage), 0 when unknown.
long double peak_resident_bytes();

// The memory a rank has: the host's, and the GPU's with the CUDA backend (0: unknown, not checked).
struct MemoryLimits {
  long double host = 0, device = 0;
};

// Refuses (UsageError naming the settings behind the largest term and the figures) a run whose
// estimate exceeds the memory that holds it.
void check_memory_fits(const config::ConfigContainer& c, const config::Derived& d, config::FrontEnd fe, bool cuda,
                       MemoryLimits limits);

// The indices term alone, for what builds the datasets without a model (`laoyao data-samples`).
void check_dataset_indices_fit(const config::ConfigContainer& c, const config::Derived& d, config::FrontEnd fe,
                               long double memory_bytes);

}  // namespace laoyao::train
