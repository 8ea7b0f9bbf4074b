// Symbols of loaded ELF objects from their .symtab (not only the dynamic symbol table): finds
// functions that dlsym/dladdr cannot see (hidden or static ones, e.g. CPython's
// _Py_DumpTracebackThreads, which is not exported by 3.9, 3.10 and 3.13).
//
// Reads the files from disk (the path the dynamic loader reports, /proc/self/exe for the
// executable); a stripped object has no .symtab and yields nothing. Not async-signal-safe:
// call from an ordinary thread. ElfSymbolCache is not thread-safe (one per capture).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace flare::hang {

struct LoadedObject {
  std::string path;    // as the loader reports it; the executable's is /proc/self/exe
  uintptr_t base = 0;  // load bias (dlpi_addr)
};

// Every object loaded in this process (dl_iterate_phdr).
std::vector<LoadedObject> loadedObjects();

// The address of function `name` in the first loaded object whose path contains
// `path_contains` (empty: any) and whose .symtab or .dynsym defines it; 0 when none.
uintptr_t findFunction(std::string_view name, std::string_view path_contains);

// Function symbols of one file, sorted by address, for address -> name lookups.
class ElfSymbolTable {
 public:
  // Loads `path`; an unreadable or stripped file gives an empty table.
  explicit ElfSymbolTable(const std::string& path);
  // The function containing file address `addr` (relative to the load bias), or "".
  std::string_view lookup(uint64_t addr) const;
  // The value of function `name`, or 0.
  uint64_t find(std::string_view name) const;
  size_t size() const { return syms_.size(); }

 private:
  struct Sym {
    uint64_t value, size;
    uint32_t name;  // offset into names_
  };
  std::vector<Sym> syms_;
  std::string names_;
};

// Tables loaded once per path.
class ElfSymbolCache {
 public:
  const ElfSymbolTable& get(const std::string& path);

 private:
  std::map<std::string, std::unique_ptr<ElfSymbolTable>> tables_;
};

}  // namespace flare::hang
