// TensorBoard event files read back as a training log, so that `laoyao compare-logs` takes
// Megatron's (or laoyao's) --tensorboard-dir in place of a text log. Per iteration (the event's
// step): "lm loss" and the MoE losses (load_balancing_loss, seq_load_balancing_loss,
// global_load_balancing_loss, z_loss) as losses, "grad-norm", "learning-rate", "batch-size",
// "loss-scale", "num-zeros", "params-norm", "iteration-time" (seconds, read as ms), "throughput";
// "<key> validation" and "<key> validation ppl" as evaluations during training. The "... vs
// samples" twins and every other tag are skipped, as are summaries that are not simple_value
// scalars. TensorBoard writes the iteration's own values, so the records are per iteration.
#pragma once
#include <string>

#include "train/log_parse.hpp"

namespace laoyao::train {

// An events.out.tfevents.* file, or a directory holding at least one.
bool is_tensorboard_path(const std::string& path);
// Reads the file, or the directory's event files in name order (a resumed run's later values of
// an iteration replace the earlier). Evaluations: one record for each time a step's validation
// tags were written; at the last evaluated step, the last record is taken for the test set's and
// the one before it for the validation set's end-of-training evaluation (Megatron writes both to
// the validation tags after any evaluation during training there). laoyao::UsageError naming the file for a corrupt record (a
// CRC that does not match); a record cut short at the end of a file (a run still writing) ends
// that file.
ParsedLog parse_tensorboard_events(const std::string& path);

}  // namespace laoyao::train
