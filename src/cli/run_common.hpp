// What pretrain-gpt and run-recipe share once a config is resolved: printing the front end's
// notes and warnings, refusing what the engine cannot do, writing run_config.yaml, training.
#pragma once
#include "config/front_ends.hpp"

namespace laoyao::cli {

void print_messages(const config::Resolved& r);

// Refuses (exit 2, nothing written) or runs the training; returns the exit status.
int start_training(config::Resolved& r);

}  // namespace laoyao::cli
