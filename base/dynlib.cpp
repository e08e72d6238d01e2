#include "base/dynlib.h"

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>

namespace tf {

DynamicLibrary::~DynamicLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

DynamicLibrary& DynamicLibrary::operator=(DynamicLibrary&& o) noexcept {
  std::swap(handle_, o.handle_);
  std::swap(path_, o.path_);
  return *this;
}

StatusOr<DynamicLibrary> DynamicLibrary::Open(const std::string& path) {
  dlerror();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = dlerror();
    return Status(StatusCode::kNotFound, why != nullptr ? std::string(why) : path + ": cannot be loaded");
  }
  DynamicLibrary lib;
  lib.handle_ = h;
  lib.path_ = path;
  char origin[4096] = {0};
  if (path.find('/') == std::string::npos && dlinfo(h, RTLD_DI_ORIGIN, origin) == 0) {
    lib.path_ = std::string(origin) + "/" + path;  // found through the loader's path: say where
  }
  return lib;
}

void* DynamicLibrary::Symbol(const char* name) const {
  return handle_ != nullptr ? dlsym(handle_, name) : nullptr;
}

std::vector<std::string> NvidiaLibraryCandidates(const std::string& soname, const std::string& home_env,
                                                 const std::string& wheel_dir) {
  std::vector<std::string> c;
  if (const char* h = std::getenv(home_env.c_str()); h != nullptr && *h != '\0') {
    c.push_back(std::string(h) + "/lib/" + soname);
    c.push_back(std::string(h) + "/lib64/" + soname);
  }
  c.push_back(soname);
  if (const char* h = std::getenv("CUDA_HOME"); h != nullptr && *h != '\0') {
    c.push_back(std::string(h) + "/lib64/" + soname);
    c.push_back(std::string(h) + "/lib/" + soname);
  }
  const std::string tail = "/nvidia/" + wheel_dir + "/lib/" + soname;
  for (const char* prefix : {"/opt/torch/.venv/lib/python3*/site-packages", "/opt/*/.venv/lib/python3*/site-packages",
                             "/opt/venv/lib/python3*/site-packages", "/usr/local/lib/python3*/dist-packages",
                             "/usr/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                             "/opt/conda/lib/python3*/site-packages"}) {
    c.push_back(prefix + tail);
  }
  return c;
}

StatusOr<DynamicLibrary> LoadLibrary(const LibrarySearch& search,
                                     const std::function<Status(const DynamicLibrary&)>& accept) {
  std::vector<std::string> tried;
  auto attempt = [&](const std::string& path) -> std::optional<DynamicLibrary> {
    auto lib = DynamicLibrary::Open(path);
    if (!lib.ok()) {
      tried.push_back(lib.status().message());
      return std::nullopt;
    }
    if (accept) {
      if (Status s = accept(*lib); !s.ok()) {
        tried.push_back(lib->path() + ": " + s.message());
        return std::nullopt;  // closed here, so its sub-libraries cannot be shared with a later candidate
      }
    }
    return std::move(lib).value();
  };
  auto join = [&] {
    std::string all;
    for (const std::string& t : tried) all += (all.empty() ? "" : "; ") + t;
    return all;
  };
  if (!search.override_env.empty()) {
    if (const char* p = std::getenv(search.override_env.c_str()); p != nullptr && *p != '\0') {
      if (auto lib = attempt(p)) return std::move(*lib);
      return Status(StatusCode::kNotFound, search.override_env + "=" + p + " cannot be used: " + join());
    }
  }
  for (const std::string& c : search.candidates) {
    std::vector<std::string> paths;
    if (c.find('*') != std::string::npos) {
      glob_t g{};
      if (glob(c.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
      }
      globfree(&g);
    } else {
      paths.push_back(c);
    }
    for (const std::string& p : paths) {
      if (auto lib = attempt(p)) return std::move(*lib);
    }
  }
  std::string msg = search.name + " not found (tried " + join() + ")";
  if (!search.hint.empty()) msg += "; " + search.hint;
  return Status(StatusCode::kNotFound, msg);
}

}  // namespace tf
