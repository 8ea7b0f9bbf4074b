#include <dlfcn.h>

#include "src/timing/transport.h"

namespace flare::timing {

std::unique_ptr<Transport> loadTransport(const std::string& library, const std::string& target,
                                         const TransportOptions& options, std::string* error) {
  // RTLD_LOCAL: gRPC's symbols stay out of the global scope (transport.h). Never closed: the
  // transport's threads may outlive any owner at process exit.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    *error = why != nullptr ? why : ("cannot load " + library);
    return nullptr;
  }
  auto create = reinterpret_cast<FlareTransportCreateFn>(dlsym(handle, kTransportCreateSymbol));
  if (create == nullptr) {
    *error = library + " has no " + kTransportCreateSymbol;
    return nullptr;
  }
  char buffer[256] = {};
  Transport* transport = create(target.c_str(), &options, buffer, sizeof(buffer));
  if (transport == nullptr) {
    *error = buffer;
    return nullptr;
  }
  return std::unique_ptr<Transport>(transport);
}

}  // namespace flare::timing
