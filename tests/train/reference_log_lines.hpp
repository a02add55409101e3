// Real Megatron log lines quoted in shared/reference, shared by the train tests.
#pragma once
#include <string>

namespace laoyao::train::test {

// megatron-lm.md §10.1 [run]
const std::string kMlmLine =
    " [2026-11-30 05:34:22.661240] iteration        1/      30 | consumed samples:           32 |"
    " elapsed time per iteration (ms): 3054.0 | throughput per GPU (TFLOP/s/GPU): 0.3 |"
    " learning rate: 2.910000E-04 | global batch size:    32 | lm loss: 1.042071E+01 |"
    " loss scale: 1.0 | grad norm: 0.651 | number of skipped iterations:   0 |"
    " number of nan iterations:   0 |";

// megatron-bridge.md §7.1 (Megatron-Bridge issue #4024)
const std::string kBridgeLine =
    " [2026-05-28 22:32:59] iteration       43/    6069 | consumed samples:        22016 |"
    " elapsed time per iteration (ms): 26714.9 | learning rate: 8.600000E-05 |"
    " global batch size:   512 | lm loss: 7.866524E-01 | seq_load_balancing_loss: 1.228777E+00 |"
    " mtp_1 loss: 1.109981E+00 | mtp_2 loss: 1.170827E+00 | loss scale: 1.0 | grad norm: 1.517 |"
    " number of skipped iterations:   0 | number of nan iterations:   0 |";

// megatron-lm.md §10.2 [run] (dash lines as evaluate_and_print_results prints them: len + 1)

}  // namespace laoyao::train::test
