#include "src/hook/real.h"

#include <dlfcn.h>
#include <link.h>

#include <cstring>

namespace flare::hook {
namespace {

// Any address inside libflare_hook.so, to recognize (and skip) ourselves.
int g_self_marker;

bool isSelf(void* p) {
  Dl_info a, b;
  if (!dladdr(p, &a) || !dladdr(reinterpret_cast<void*>(&g_self_marker), &b)) return false;
  return a.dli_fbase == b.dli_fbase;
}

struct Search {
  const char* name;
  const char* prefix;
  void* found;
};

int visit(dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<Search*>(data);
  if (!info->dlpi_name || !*info->dlpi_name) return 0;
  const char* base = std::strrchr(info->dlpi_name, '/');
  base = base ? base + 1 : info->dlpi_name;
  if (std::strncmp(base, s->prefix, std::strlen(s->prefix)) != 0) return 0;
  void* h = dlopen(info->dlpi_name, RTLD_NOLOAD | RTLD_LAZY);
  if (!h) return 0;
  void* p = dlsym(h, s->name);
  dlclose(h);
  if (!p || isSelf(p)) return 0;
  s->found = p;
  return 1;
}

}  // namespace

void* realSymbol(const char* name, const char* lib_prefix) {
  void* p = dlsym(RTLD_NEXT, name);
  if (p && !isSelf(p)) return p;
  Search s{name, lib_prefix, nullptr};
  dl_iterate_phdr(visit, &s);
  if (s.found && !isSelf(s.found)) return s.found;
  return nullptr;
}

}  // namespace flare::hook
