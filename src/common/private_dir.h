// Private folders for files Flare writes on a shared machine (the spool): created mode 0700,
// every component Flare creates opened with O_NOFOLLOW, and a folder owned by another user
// refused — so that nobody else can read the spool (it holds tokens and the job's records) or
// steer its files elsewhere (a pre-made symlink /tmp/flare/<job>/<rank> -> somewhere).
//
// The default spool root is per user: /tmp/flare-<uid>. A root the operator chose
// (FLARE_OUTPUT_DIR) is followed if it is a symlink, but it must belong to this user too.
//
// Thread-safe (no state); never throws.
#pragma once

#include <string>
#include <vector>

namespace flare::common {

// /tmp/flare-<effective uid>.
std::string defaultSpoolRoot();

// Makes sure `root`/`subdirs[0]`/`subdirs[1]`/... exist as this user's folders: `root` is
// created (0700, with any missing parents) when missing; each subfolder is created 0700 and
// opened O_NOFOLLOW. Refused, with the reason in `error`: a subfolder that is a symbolic link or
// not a folder, any of them owned by another user, and `root` itself when it is a symlink and
// `root_is_default` (Flare's own /tmp/flare-<uid>, which it also narrows to 0700). On success
// returns the joined path.
bool makePrivateDirs(const std::string& root, bool root_is_default,
                     const std::vector<std::string>& subdirs, std::string* path,
                     std::string* error);

}  // namespace flare::common
