#include "core/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.hpp"

namespace laoyao {

std::string read_file(const std::string& path) {
  // An ifstream opens a directory and reads it as empty: say what it is instead.
  std::error_code ec;
  const auto kind = std::filesystem::status(path, ec).type();
  if (kind == std::filesystem::file_type::directory)
    throw UsageError("'" + path + "' is a directory; a file was expected there");
  // A device never ends (/dev/zero, /dev/urandom): read whole, it would fill the memory. A pipe
  // (bash's <(...)) is read as the file it stands for.
  if (kind == std::filesystem::file_type::character || kind == std::filesystem::file_type::block ||
      kind == std::filesystem::file_type::socket)
    throw UsageError("'" + path + "' is a device or socket; a file was expected there");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read file '" + path + "': " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw UsageError("cannot read file '" + path + "': " + std::strerror(errno));
  return ss.str();
}

bool file_exists(const std::string& path) { return std::filesystem::exists(path); }

void make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw Error("cannot create directory '" + path + "': " + ec.message());
}

static void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  std::filesystem::path p(path);
  if (p.has_parent_path()) make_dirs(p.parent_path().string());
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error("cannot write '" + tmp + "': " + std::strerror(errno));
  const char* data = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error("cannot write '" + tmp + "': " + std::strerror(e));
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot flush '" + tmp + "': " + std::strerror(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(e));
  }
  fsync_path(p.has_parent_path() ? p.parent_path().string() : ".", O_RDONLY | O_DIRECTORY);
}

}  // namespace laoyao

namespace laoyao {

ScratchFolder::ScratchFolder(const std::string& final_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  final_ = fs::absolute(final_path).lexically_normal().string();
  if (!final_.empty() && final_.back() == '/') final_.pop_back();
  if (fs::exists(final_, ec) && !(fs::is_directory(final_, ec) && fs::is_empty(final_, ec)))
    throw UsageError("output folder '" + final_path + "' already exists and is not empty (choose a new one)");
  scratch_ = final_ + ".tmp." + std::to_string(::getpid());
  fs::remove_all(scratch_, ec);
  make_dirs(scratch_);
}

ScratchFolder::~ScratchFolder() {
  std::error_code ec;
  if (!committed_) std::filesystem::remove_all(scratch_, ec);
}

void ScratchFolder::commit() {
  namespace fs = std::filesystem;
  std::error_code ec;
  fsync_path(scratch_, O_RDONLY | O_DIRECTORY);
  if (fs::exists(final_, ec)) fs::remove(final_, ec);  // an empty folder (the constructor checked)
  if (::rename(scratch_.c_str(), final_.c_str()) != 0)
    throw Error("cannot rename '" + scratch_ + "' to '" + final_ + "': " + std::strerror(errno));
  const std::string parent = fs::path(final_).parent_path().string();
  fsync_path(parent.empty() ? "." : parent, O_RDONLY | O_DIRECTORY);
  committed_ = true;
}

}  // namespace laoyao
