// Private spool folders: created 0700, symlinked components and other users' folders refused,
// nothing created through a link.
#include "src/common/private_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

namespace flare::common {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class PrivateDirTest : public ::testing::Test {
 protected:
  PrivateDirTest() {
    dir_ = fs::temp_directory_path() / ("flare_private_dir_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~PrivateDirTest() override { fs::remove_all(dir_); }
  static mode_t mode(const fs::path& p) {
    struct stat st {};
    ::lstat(p.c_str(), &st);
    return st.st_mode & 0777;
  }
  fs::path dir_;
};

TEST_F(PrivateDirTest, CreatesEveryFolder0700) {
  std::string path, err;
  const fs::path root = dir_ / "root";
  ASSERT_TRUE(makePrivateDirs(root.string(), true, {"job", "0"}, &path, &err)) << err;
  EXPECT_EQ(path, (root / "job" / "0").string());
  EXPECT_EQ(mode(root), 0700u);
  EXPECT_EQ(mode(root / "job"), 0700u);
  EXPECT_EQ(mode(root / "job" / "0"), 0700u);
  // Again: the same folders, fine.
  EXPECT_TRUE(makePrivateDirs(root.string(), true, {"job", "0"}, &path, &err)) << err;
  // Flare's own default root is narrowed to 0700 when someone widened it.
  ::chmod(root.c_str(), 0777);
  EXPECT_TRUE(makePrivateDirs(root.string(), true, {}, &path, &err)) << err;
  EXPECT_EQ(mode(root), 0700u);
}

TEST_F(PrivateDirTest, ASymlinkedComponentIsRefusedAndNothingIsCreatedThroughIt) {
  const fs::path root = dir_ / "root", elsewhere = dir_ / "elsewhere";
  fs::create_directories(root / "job");
  fs::create_directories(elsewhere);
  fs::create_directory_symlink(elsewhere, root / "job" / "0");  // the probe
  std::string path, err;
  EXPECT_FALSE(makePrivateDirs(root.string(), true, {"job", "0"}, &path, &err));
  EXPECT_THAT(err, HasSubstr("symbolic link"));
  EXPECT_FALSE(makePrivateDirs(root.string(), true, {"job", "0", "deeper"}, &path, &err));
  EXPECT_TRUE(fs::is_empty(elsewhere));
  // Flare's default root itself as a link: refused too; an operator's chosen root is followed.
  fs::create_directory_symlink(elsewhere, dir_ / "link-root");
  EXPECT_FALSE(makePrivateDirs((dir_ / "link-root").string(), true, {"job"}, &path, &err));
  EXPECT_TRUE(fs::is_empty(elsewhere));
  EXPECT_TRUE(makePrivateDirs((dir_ / "link-root").string(), false, {"job"}, &path, &err)) << err;
}

TEST_F(PrivateDirTest, FoldersOfAnotherUserAreRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a folder of another user";
  const fs::path root = dir_ / "root";
  fs::create_directories(root / "job");
  ASSERT_EQ(::chown((root / "job").c_str(), 65534, 65534), 0);
  std::string path, err;
  EXPECT_FALSE(makePrivateDirs(root.string(), false, {"job", "0"}, &path, &err));
  EXPECT_THAT(err, HasSubstr("belongs to uid 65534"));
  EXPECT_FALSE(fs::exists(root / "job" / "0"));
  ASSERT_EQ(::chown(root.c_str(), 65534, 65534), 0);
  EXPECT_FALSE(makePrivateDirs(root.string(), false, {}, &path, &err));
}

TEST_F(PrivateDirTest, BadNamesAreRefused) {
  std::string path, err;
  for (const char* bad : {"", ".", "..", "a/b"})
    EXPECT_FALSE(makePrivateDirs(dir_.string(), false, {bad}, &path, &err)) << bad;
}

TEST(DefaultSpoolRootTest, IsPerUser) {
  EXPECT_EQ(defaultSpoolRoot(), "/tmp/flare-" + std::to_string(::geteuid()));
}

}  // namespace
}  // namespace flare::common
