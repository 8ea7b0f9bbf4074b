#include "src/common/private_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

namespace flare::common {
namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// False (with `error`) when `fd` is not a folder owned by this user.
bool ours(int fd, const std::string& path, std::string* error) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *error = "cannot stat " + path + ": " + std::strerror(errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    *error = path + " is not a folder";
    return false;
  }
  if (st.st_uid != ::geteuid()) {
    *error = path + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
             std::to_string(::geteuid()) + "): refused";
    return false;
  }
  return true;
}

}  // namespace

std::string defaultSpoolRoot() {
  return "/tmp/flare-" + std::to_string(::geteuid());
}

bool makePrivateDirs(const std::string& root, bool root_is_default,
                     const std::vector<std::string>& subdirs, std::string* path,
                     std::string* error) {
  if (root.empty()) {
    *error = "no spool folder";
    return false;
  }
  std::string at = root;
  struct stat st {};
  if (::lstat(root.c_str(), &st) != 0) {
    std::error_code ec;
    const auto parent = std::filesystem::path(root).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (::mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) {
      *error = "cannot create " + root + ": " + std::strerror(errno);
      return false;
    }
  }
  Fd dir;
  dir.fd =
      ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | (root_is_default ? O_NOFOLLOW : 0));
  if (dir.fd < 0) {
    *error = (errno == ELOOP || errno == ENOTDIR)
                 ? root + " is a symbolic link or not a folder: refused"
                 : "cannot open " + root + ": " + std::strerror(errno);
    return false;
  }
  if (!ours(dir.fd, root, error)) return false;
  if (root_is_default && ::fstat(dir.fd, &st) == 0 && (st.st_mode & 077) != 0)
    ::fchmod(dir.fd, 0700);
  for (const std::string& sub : subdirs) {
    if (sub.empty() || sub == "." || sub == ".." || sub.find('/') != std::string::npos) {
      *error = "'" + sub + "' is not a folder name";
      return false;
    }
    at += "/" + sub;
    if (::mkdirat(dir.fd, sub.c_str(), 0700) != 0 && errno != EEXIST) {
      *error = "cannot create " + at + ": " + std::strerror(errno);
      return false;
    }
    Fd next;
    next.fd = ::openat(dir.fd, sub.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next.fd < 0) {
      *error = (errno == ELOOP || errno == ENOTDIR)
                   ? at + " is a symbolic link or not a folder: refused"
                   : "cannot open " + at + ": " + std::strerror(errno);
      return false;
    }
    if (!ours(next.fd, at, error)) return false;
    std::swap(dir.fd, next.fd);
  }
  *path = at;
  return true;
}

}  // namespace flare::common
