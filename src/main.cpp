#include "cli/cli.hpp"

int main(int argc, char** argv) { return laoyao::cli::main(argc, argv); }
