// Whole-file reads and atomic writes. A write goes to "<path>.tmp.<pid>", is fsynced, then renamed
// over <path> (and the directory fsynced), so a reader sees the old file or the new one, never half.
#pragma once
#include <string>

namespace laoyao {

std::string read_file(const std::string& path);  // UsageError naming the path (missing, a directory, unreadable)
void write_file_atomic(const std::string& path, const std::string& contents);
bool file_exists(const std::string& path);
void make_dirs(const std::string& path);  // mkdir -p

}  // namespace laoyao
