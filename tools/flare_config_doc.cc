// flare-config-doc: prints the table of every declared setting (src/common/config.cc) as Markdown,
// or checks/rewrites the generated section of docs/configuration.md.
//
//   flare-config-doc                 print the table
//   flare-config-doc --check FILE    exit 1 if FILE's generated section differs
//   flare-config-doc --write FILE    rewrite FILE's generated section
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "src/common/config.h"

namespace {

constexpr const char* kBegin = "<!-- BEGIN GENERATED: flare-config-doc -->";
constexpr const char* kEnd = "<!-- END GENERATED: flare-config-doc -->";

std::string table() {
  std::ostringstream out;
  out << "| variable | type | default | subsystem | meaning |\n";
  out << "|---|---|---|---|---|\n";
  for (const auto& p : flare::common::allParams()) {
    std::string def = *p.default_value ? std::string("`") + p.default_value + "`" : "(unset)";
    out << "| `" << p.name << "` | " << p.type << " | " << def << " | " << p.subsystem << " | "
        << p.help << " |\n";
  }
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 1) {
    std::fputs(table().c_str(), stdout);
    return 0;
  }
  if (argc != 3 || (std::string(argv[1]) != "--check" && std::string(argv[1]) != "--write")) {
    std::fprintf(stderr, "usage: flare-config-doc [--check|--write FILE]\n");
    return 2;
  }
  std::ifstream in(argv[2]);
  std::stringstream buf;
  buf << in.rdbuf();
  std::string doc = buf.str();
  auto b = doc.find(kBegin), e = doc.find(kEnd);
  if (!in || b == std::string::npos || e == std::string::npos || e < b) {
    std::fprintf(stderr, "flare-config-doc: %s has no generated section (%s ... %s)\n", argv[2],
                 kBegin, kEnd);
    return 2;
  }
  const std::string want = std::string(kBegin) + "\n" + table() + kEnd;
  const std::string have = doc.substr(b, e + std::string(kEnd).size() - b);
  if (std::string(argv[1]) == "--check") {
    if (have == want) return 0;
    std::fprintf(stderr,
                 "flare-config-doc: %s is out of date with the settings declared in "
                 "src/common/config.cc; run `flare-config-doc --write %s`\n",
                 argv[2], argv[2]);
    return 1;
  }
  doc.replace(b, have.size(), want);
  std::ofstream(argv[2]) << doc;
  return 0;
}
