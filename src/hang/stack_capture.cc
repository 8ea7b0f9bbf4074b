#include "src/hang/stack_capture.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "src/common/text.h"
#include "src/hang/elf_symbols.h"

namespace flare::hang {
namespace {

enum SlotState : int { kPending = 0, kWriting = 1, kDone = 2, kAbandoned = 3 };

struct Slot {
  pid_t tid = 0;
  std::atomic<int> state{kPending};
  uintptr_t self = 0;  // pthread_self() of the thread
  uintptr_t pc = 0;    // interrupted PC
  int nframes = 0;
  void* frames[kMaxNativeFrames];
};

struct Area {
  int max_frames = 0;
  size_t nslots = 0;
  std::unique_ptr<Slot[]> slots;
};

std::atomic<Area*> g_area{nullptr};
std::atomic<int> g_in_handler{0};
std::mutex g_capture_mu;
int g_signal = 0;  // guarded by g_capture_mu

int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

pid_t gettid_() {
  return static_cast<pid_t>(syscall(SYS_gettid));
}

uintptr_t contextPc(void* ucv) {
  auto* uc = static_cast<ucontext_t*>(ucv);
#if defined(__x86_64__)
  return uintptr_t(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return uintptr_t(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

// Async-signal-safe: atomics, syscall(gettid), backtrace() (libgcc preloaded at install).
void onSignal(int, siginfo_t* info, void* uc) {
  const int saved_errno = errno;
  g_in_handler.fetch_add(1, std::memory_order_acq_rel);
  Area* a = g_area.load(std::memory_order_acquire);
  if (a && info && info->si_code == SI_TKILL && info->si_pid == getpid()) {
    const pid_t me = gettid_();
    for (size_t i = 0; i < a->nslots; ++i) {
      Slot& s = a->slots[i];
      if (s.tid != me) continue;
      int expected = kPending;
      if (s.state.compare_exchange_strong(expected, kWriting, std::memory_order_acq_rel)) {
        s.self = uintptr_t(pthread_self());
        s.pc = contextPc(uc);
        s.nframes = backtrace(s.frames, a->max_frames);
        s.state.store(kDone, std::memory_order_release);
      }
      break;
    }
  }
  g_in_handler.fetch_sub(1, std::memory_order_acq_rel);
  errno = saved_errno;
}

bool isOurs(const struct sigaction& sa) {
  return (sa.sa_flags & SA_SIGINFO) && sa.sa_sigaction == onSignal;
}

// A real-time signal with our handler: the current one if still ours, else the first one with
// no handler. Never replaces an application's handler.
int ensureSignal(std::string* error) {
  struct sigaction old;
  if (g_signal && sigaction(g_signal, nullptr, &old) == 0 && isOurs(old)) return g_signal;
  {
    void* warm[2];
    backtrace(warm, 2);  // loads libgcc_s now, not inside the handler
  }
  for (int sig = SIGRTMIN + 6; sig <= SIGRTMAX - 2; ++sig) {
    if (sigaction(sig, nullptr, &old) != 0) continue;
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler != SIG_DFL) continue;
    if ((old.sa_flags & SA_SIGINFO) && !isOurs(old)) continue;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = onSignal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, nullptr) == 0) {
      g_signal = sig;
      return sig;
    }
  }
  *error = "no free real-time signal for the stack capture";
  return 0;
}

std::vector<pid_t> listThreads() {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc/self/task");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    out.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string threadName(pid_t tid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/comm", int(tid));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[64];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return {};
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\0')) --n;
  return std::string(buf, size_t(n));
}

// Frame i of a stack: frame 0 is the exact PC, callers are return addresses (pc - 1 lies in
// the calling instruction).
void symbolize(uintptr_t pc, bool exact, ElfSymbolCache& cache, flare::v1::NativeFrame* f) {
  f->set_pc(pc);
  const uintptr_t lookup = exact ? pc : pc - 1;
  Dl_info info;
  struct link_map* lm = nullptr;
  if (!dladdr1(reinterpret_cast<void*>(lookup), &info, reinterpret_cast<void**>(&lm),
               RTLD_DL_LINKMAP) ||
      !lm) {
    return;
  }
  std::string module = info.dli_fname ? info.dli_fname : "";
  const uintptr_t bias = lm->l_addr;
  f->set_offset(pc - bias);
  if (info.dli_sname) {
    f->set_symbol(common::demangle(info.dli_sname));
  } else {
    const std::string path = (module.empty() || lm->l_name == nullptr || lm->l_name[0] == '\0')
                                 ? "/proc/self/exe"
                                 : module;
    std::string_view name = cache.get(path).lookup(lookup - bias);
    if (!name.empty()) f->set_symbol(common::demangle(std::string(name).c_str()));
  }
  if (module.empty() || (lm->l_name && lm->l_name[0] == '\0')) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) module.assign(exe, size_t(n));
  }
  f->set_module(module);
}

void fillNative(flare::v1::ThreadStack* t, void* const* frames, int n, uintptr_t pc,
                ElfSymbolCache& cache) {
  int first = 0;
  if (pc) {
    for (int i = 0; i < n; ++i) {
      if (uintptr_t(frames[i]) == pc) {
        first = i;
        break;
      }
    }
  }
  for (int i = first; i < n; ++i) {
    symbolize(uintptr_t(frames[i]), pc && i == first, cache, t->add_native_frames());
  }
}

using DumpFn = const char* (*)(int, void*, void*);
using MainInterpFn = void* (*)();
using IsInitFn = int (*)();

}  // namespace

std::vector<PythonThreadDump> parsePythonDump(std::string_view text, int* skipped) {
  std::vector<PythonThreadDump> out;
  int bad = 0;
  for (std::string_view line : common::splitLines(text)) {
    if (line.empty()) continue;
    auto startsWith = [&](std::string_view p) { return line.substr(0, p.size()) == p; };
    if (startsWith("Thread 0x") || startsWith("Current thread 0x")) {
      PythonThreadDump t;
      t.current = startsWith("Current");
      const size_t hex = line.find("0x") + 2;
      t.ident = std::strtoull(std::string(line.substr(hex, 32)).c_str(), nullptr, 16);
      out.push_back(std::move(t));
      continue;
    }
    const std::string_view kFile = "  File \"";
    if (startsWith(kFile) && !out.empty()) {
      const size_t end = line.find("\", line ", kFile.size());
      if (end == std::string_view::npos) {
        bad++;
        continue;
      }
      flare::v1::PythonFrame f;
      f.set_file(std::string(line.substr(kFile.size(), end - kFile.size())));
      std::string_view rest = line.substr(end + 8);  // after `", line `
      const size_t in = rest.find(" in ");
      if (in == std::string_view::npos) {
        bad++;
        continue;
      }
      std::string number(rest.substr(0, in));
      f.set_line(number == "???" ? -1 : std::atoi(number.c_str()));
      f.set_function(std::string(rest.substr(in + 4)));
      out.back().frames.push_back(std::move(f));
      continue;
    }
    // "  <no Python frame>", "  ...", "  <truncated rest of calls>" and the like.
    if (!startsWith("  <") && !startsWith("  ...")) bad++;
  }
  if (skipped) *skipped = bad;
  return out;
}

bool dumpPythonThreads(std::string* text, std::string* why) {
  auto is_init = reinterpret_cast<IsInitFn>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
  auto main_interp = reinterpret_cast<MainInterpFn>(dlsym(RTLD_DEFAULT, "PyInterpreterState_Main"));
  if (!is_init || !main_interp || !is_init()) {
    *why = "not a Python process";
    return false;
  }
  auto dump = reinterpret_cast<DumpFn>(dlsym(RTLD_DEFAULT, "_Py_DumpTracebackThreads"));
  if (!dump) {
    // Not exported: find it in the .symtab of the object that defines Py_IsInitialized.
    Dl_info info;
    struct link_map* lm = nullptr;
    if (dladdr1(reinterpret_cast<void*>(is_init), &info, reinterpret_cast<void**>(&lm),
                RTLD_DL_LINKMAP) &&
        lm) {
      const std::string path =
          (lm->l_name && lm->l_name[0]) ? std::string(lm->l_name) : "/proc/self/exe";
      if (uint64_t v = ElfSymbolTable(path).find("_Py_DumpTracebackThreads")) {
        dump = reinterpret_cast<DumpFn>(lm->l_addr + v);
      }
    }
  }
  if (!dump) {
    *why = "_Py_DumpTracebackThreads not found (stripped interpreter)";
    return false;
  }
  void* interp = main_interp();
  if (!interp) {
    *why = "no main interpreter";
    return false;
  }
  int fd = static_cast<int>(syscall(SYS_memfd_create, "flare-pystacks", 1u /*MFD_CLOEXEC*/));
  if (fd < 0) {
    *why = std::string("memfd_create: ") + std::strerror(errno);
    return false;
  }
  const char* err = dump(fd, interp, nullptr);
  text->clear();
  off_t size = lseek(fd, 0, SEEK_END);
  if (size > 0) {
    text->resize(size_t(size));
    ssize_t got = pread(fd, text->data(), text->size(), 0);
    text->resize(got > 0 ? size_t(got) : 0);
  }
  close(fd);
  if (err) {
    *why = err;
    return !text->empty();
  }
  return true;
}

bool captureStacks(const CaptureOptions& options, flare::v1::StackDump* out, CaptureStats* stats,
                   std::string* error) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  CaptureStats local;
  CaptureStats& st = stats ? *stats : local;
  st = CaptureStats{};
  out->Clear();
  const int64_t start = nowNs();
  out->set_captured_ns(start);
  const pid_t pid = getpid();
  const pid_t me = gettid_();
  const std::vector<pid_t> tids = listThreads();
  st.threads = int(tids.size());
  const int max_frames = std::clamp(options.max_frames, 1, kMaxNativeFrames);

  auto area = std::make_unique<Area>();
  area->max_frames = max_frames;
  area->nslots = tids.size();
  area->slots = std::make_unique<Slot[]>(tids.size());
  for (size_t i = 0; i < tids.size(); ++i) area->slots[i].tid = tids[i];

  bool native = options.native;
  if (native) {
    st.signal = ensureSignal(error);
    if (!st.signal) native = false;
  }
  std::vector<bool> signalled(tids.size(), false);
  if (native) {
    g_area.store(area.get(), std::memory_order_release);
    for (size_t i = 0; i < tids.size(); ++i) {
      Slot& s = area->slots[i];
      if (s.tid == me) {
        s.self = uintptr_t(pthread_self());
        s.nframes = backtrace(s.frames, max_frames);
        s.state.store(kDone);
        continue;
      }
      if (syscall(SYS_tgkill, pid, s.tid, st.signal) == 0) {
        signalled[i] = true;
      } else {
        s.state.store(kAbandoned);
        st.vanished++;
      }
    }
    // Wait for every slot, until the deadline.
    const int64_t deadline = nowNs() + options.thread_timeout_ms * 1'000'000;
    for (;;) {
      bool pending = false;
      for (size_t i = 0; i < tids.size(); ++i) {
        int s = area->slots[i].state.load(std::memory_order_acquire);
        if (s == kPending || s == kWriting) pending = true;
      }
      if (!pending || nowNs() >= deadline) break;
      timespec ts{0, 200'000};
      nanosleep(&ts, nullptr);
    }
    bool leak = false;
    for (size_t i = 0; i < tids.size(); ++i) {
      Slot& s = area->slots[i];
      int expected = kPending;
      if (s.state.compare_exchange_strong(expected, kAbandoned)) continue;
      // A handler that started writing finishes quickly; give it one more timeout.
      const int64_t grace = nowNs() + options.thread_timeout_ms * 1'000'000;
      while (s.state.load(std::memory_order_acquire) == kWriting && nowNs() < grace) {
        timespec ts{0, 200'000};
        nanosleep(&ts, nullptr);
      }
      if (s.state.load() == kWriting) leak = true;
    }
    g_area.store(nullptr, std::memory_order_release);
    const int64_t grace = nowNs() + options.thread_timeout_ms * 1'000'000;
    while (g_in_handler.load(std::memory_order_acquire) != 0 && nowNs() < grace) {
      timespec ts{0, 200'000};
      nanosleep(&ts, nullptr);
    }
    if (leak || g_in_handler.load() != 0) {
      // A handler may still touch the area: never free it (a few KiB, on a failure path).
      (void)area.release();
    }
  }

  // Build the threads: the main thread first.
  ElfSymbolCache cache;
  std::unordered_map<uintptr_t, flare::v1::ThreadStack*> by_self;
  std::vector<size_t> order(tids.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return tids[i] == pid; });
  Area* a = area ? area.get() : nullptr;
  for (size_t i : order) {
    const Slot& s = a->slots[i];
    const int state = s.state.load(std::memory_order_acquire);
    if (native && state == kAbandoned && !signalled[i] && s.tid != me) continue;  // vanished
    flare::v1::ThreadStack* t = out->add_threads();
    t->set_thread_id(uint64_t(s.tid));
    t->set_name(threadName(s.tid));
    t->set_main_thread(s.tid == pid);
    if (!native) continue;
    if (state == kDone) {
      st.answered++;
      fillNative(t, s.frames, s.nframes, s.pc, cache);
      if (s.self) by_self[s.self] = t;
    } else {
      t->set_timed_out(true);
      st.timed_out++;
    }
  }
  out->set_threads_not_answering(uint32_t(st.timed_out));

  if (options.python) {
    std::string text, why;
    if (dumpPythonThreads(&text, &why)) {
      st.python_status = "ok";
    } else {
      st.python_status = why;
    }
    for (PythonThreadDump& p : parsePythonDump(text)) {
      st.python_threads++;
      flare::v1::ThreadStack* t;
      auto it = by_self.find(uintptr_t(p.ident));
      if (it != by_self.end()) {
        t = it->second;
      } else {
        // Not matched to a native thread (it did not answer, or no native capture).
        t = out->add_threads();
        char name[64];
        std::snprintf(name, sizeof(name), "python thread 0x%llx",
                      static_cast<unsigned long long>(p.ident));
        t->set_name(name);
      }
      for (auto& f : p.frames) *t->add_python_frames() = std::move(f);
    }
  }
  if (!native && st.python_threads == 0) {
    if (error->empty()) *error = "no stack could be captured: " + st.python_status;
    return false;
  }
  return true;
}

}  // namespace flare::hang
