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
