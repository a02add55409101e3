// Whole-file reads and atomic writes. A write goes to "<path>.tmp.<pid>", is fsynced, then renamed
// over <path> (and the directory fsynced), so a reader sees the old file or the new one, never half.
#pragma once
#include <string>

namespace laoyao {

std::string read_file(const std::string& path);  // UsageError naming the path (missing, a directory, unreadable)
void write_file_atomic(const std::string& path, const std::string& contents);
bool file_exists(const std::string& path);
void make_dirs(const std::string& path);  // mkdir -p

// A new folder built under a scratch name beside `final_path` ("<final_path>.tmp.<pid>") and moved
// into place by commit(); removed, with what was written into it, if never committed. final_path
// must not exist, or be an empty folder (UsageError naming it otherwise).
class ScratchFolder {
 public:
  explicit ScratchFolder(const std::string& final_path);
  ~ScratchFolder();
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  const std::string& path() const { return scratch_; }
  const std::string& final_path() const { return final_; }
  std::string file(const std::string& name) const { return scratch_ + "/" + name; }
  void commit();

 private:
  std::string final_, scratch_;
  bool committed_ = false;
};

}  // namespace laoyao
