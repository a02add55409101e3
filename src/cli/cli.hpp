// The `laoyao` command: a table of subcommands, each a function in its own cmd_*.cpp file.
#pragma once
#include <string>
#include <vector>

namespace laoyao::cli {

using Args = std::vector<std::string>;

int main(int argc, char** argv);

// Subcommands (argument list without the program and subcommand names). Each returns the
// process exit status; a laoyao::UsageError escaping one becomes exit status 2.
int cmd_pretrain_gpt(const Args& args);
int cmd_run_recipe(const Args& args);
int cmd_recipes(const Args& args);
int cmd_convert_args(const Args& args);
int cmd_compare_logs(const Args& args);
int cmd_data_samples(const Args& args);
int cmd_preprocess_data(const Args& args);
int cmd_doctor(const Args& args);
int cmd_launch(const Args& args);
int cmd_checkpoint(const Args& args);

}  // namespace laoyao::cli
