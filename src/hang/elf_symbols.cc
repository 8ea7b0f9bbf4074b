#include "src/hang/elf_symbols.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace flare::hang {
namespace {

int collect(struct dl_phdr_info* info, size_t, void* data) {
  auto* out = static_cast<std::vector<LoadedObject>*>(data);
  std::string path = info->dlpi_name ? info->dlpi_name : "";
  if (path.empty()) {
    if (!out->empty()) return 0;  // the vDSO and other unnamed objects after the executable
    path = "/proc/self/exe";
  }
  out->push_back({path, info->dlpi_addr});
  return 0;
}

}  // namespace

std::vector<LoadedObject> loadedObjects() {
  std::vector<LoadedObject> out;
  dl_iterate_phdr(collect, &out);
  return out;
}

ElfSymbolTable::ElfSymbolTable(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr))) {
    close(fd);
    return;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return;
  const auto* bytes = static_cast<const unsigned char*>(map);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(bytes);
  const bool ok = std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 &&
                  eh->e_ident[EI_CLASS] == ELFCLASS64 && eh->e_shentsize == sizeof(Elf64_Shdr) &&
                  eh->e_shoff > 0 &&
                  eh->e_shoff + uint64_t(eh->e_shnum) * sizeof(Elf64_Shdr) <= size;
  if (ok) {
    const auto* sh = reinterpret_cast<const Elf64_Shdr*>(bytes + eh->e_shoff);
    // Prefer .symtab (all functions); fall back to .dynsym (exported ones).
    for (uint32_t want : {uint32_t(SHT_SYMTAB), uint32_t(SHT_DYNSYM)}) {
      for (int i = 0; i < eh->e_shnum && syms_.empty(); ++i) {
        if (sh[i].sh_type != want || sh[i].sh_link >= eh->e_shnum) continue;
        const Elf64_Shdr& strtab = sh[sh[i].sh_link];
        if (sh[i].sh_offset + sh[i].sh_size > size || strtab.sh_offset + strtab.sh_size > size ||
            sh[i].sh_entsize != sizeof(Elf64_Sym)) {
          continue;
        }
        const auto* sym = reinterpret_cast<const Elf64_Sym*>(bytes + sh[i].sh_offset);
        const size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
        const char* strs = reinterpret_cast<const char*>(bytes + strtab.sh_offset);
        for (size_t k = 0; k < n; ++k) {
          if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC || sym[k].st_value == 0 ||
              sym[k].st_shndx == SHN_UNDEF || sym[k].st_name >= strtab.sh_size) {
            continue;
          }
          const char* name = strs + sym[k].st_name;
          const size_t len = strnlen(name, strtab.sh_size - sym[k].st_name);
          syms_.push_back({sym[k].st_value, sym[k].st_size, uint32_t(names_.size())});
          names_.append(name, len);
          names_.push_back('\0');
        }
      }
      if (!syms_.empty()) break;
    }
  }
  munmap(map, size);
  std::sort(syms_.begin(), syms_.end(),
            [](const Sym& a, const Sym& b) { return a.value < b.value; });
}

std::string_view ElfSymbolTable::lookup(uint64_t addr) const {
  auto it = std::upper_bound(syms_.begin(), syms_.end(), addr,
                             [](uint64_t a, const Sym& s) { return a < s.value; });
  if (it == syms_.begin()) return {};
  --it;
  // Zero-sized symbols (hand-written assembly) match only their first byte.
  if (addr >= it->value + std::max<uint64_t>(it->size, 1)) return {};
  return std::string_view(names_.data() + it->name);
}

uint64_t ElfSymbolTable::find(std::string_view name) const {
  for (const Sym& s : syms_) {
    if (std::string_view(names_.data() + s.name) == name) return s.value;
  }
  return 0;
}

const ElfSymbolTable& ElfSymbolCache::get(const std::string& path) {
  auto& slot = tables_[path];
  if (!slot) slot = std::make_unique<ElfSymbolTable>(path);
  return *slot;
}

uintptr_t findFunction(std::string_view name, std::string_view path_contains) {
  for (const LoadedObject& o : loadedObjects()) {
    if (!path_contains.empty() && o.path.find(path_contains) == std::string::npos) continue;
    ElfSymbolTable table(o.path);
    if (uint64_t v = table.find(name)) return o.base + v;
  }
  return 0;
}

}  // namespace flare::hang
