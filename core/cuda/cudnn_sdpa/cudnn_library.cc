// Finding and loading libcudnn: the candidates (environment, loader path, the configure-time
// library, pip wheels), the sub-libraries a pip wheel's shim needs preloaded, and the CUDA runtime
// cudnn_frontend must resolve. No cudnn_frontend here (cudnn_sdpa.cc hands it the handle).
#include <cuda_runtime.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/cuda/cudnn_sdpa/cudnn_sdpa_internal.h"

namespace attnserve {

#if defined(NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)

namespace {

std::vector<std::string> Glob(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g;
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  std::sort(out.rbegin(), out.rend());  // newest python first
  return out;
}

std::vector<std::string> CudnnCandidates() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("ATTNSERVE_CUDNN_LIBRARY"); env != nullptr && *env != '\0') {
    c.emplace_back(env);
  }
  c.emplace_back("libcudnn.so.9");
#ifdef ATTNSERVE_CUDNN_LIBRARY_HINT
  c.emplace_back(ATTNSERVE_CUDNN_LIBRARY_HINT);
#endif
  // pip wheels (nvidia-cudnn-cu12 / -cu13, PyTorch's dependency): <site>/nvidia/cudnn/lib.
  std::vector<std::string> sites = {
      "/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
      "/usr/lib/python3/dist-packages",        "/usr/lib/python3*/site-packages",
      "/opt/conda/lib/python3*/site-packages", "/opt/*/.venv/lib/python3*/site-packages",
      "/opt/*/lib/python3*/site-packages",     "/root/.local/lib/python3*/site-packages"};
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    if (const char* p = std::getenv(var); p != nullptr && *p != '\0') {
      sites.insert(sites.begin(), absl::StrCat(p, "/lib/python3*/site-packages"));
    }
  }
  for (const std::string& site : sites) {
    for (const char* sub : {"/nvidia/cudnn/lib/libcudnn.so.9", "/nvidia/cu13/lib/libcudnn.so.9",
                            "/nvidia/cu12/lib/libcudnn.so.9", "/torch/lib/libcudnn.so.9"}) {
      for (std::string& p : Glob(site + sub)) c.push_back(std::move(p));
    }
  }
  return c;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// libcudnn.so.9 is a small shim that dlopens its sub-libraries (and the engines dlopen NVRTC) by
// soname. When the shim came from a folder the loader does not search (a pip wheel), load those
// first, RTLD_GLOBAL, so the later by-name lookups find them already in the process.
void PreloadSiblings(const std::string& shim_path) {
  const std::string dir = Dirname(shim_path);
  for (const char* lib : {"libcudnn_graph.so.9", "libcudnn_engines_runtime_compiled.so.9",
                          "libcudnn_engines_precompiled.so.9", "libcudnn_heuristic.so.9",
                          "libcudnn_ops.so.9", "libcudnn_adv.so.9", "libcudnn_cnn.so.9"}) {
    const std::string p = absl::StrCat(dir, "/", lib);
    if (access(p.c_str(), R_OK) == 0) dlopen(p.c_str(), RTLD_LAZY | RTLD_GLOBAL);
  }
  // NVRTC (the runtime-compiled engines): CUDA 13 wheels put it in the same folder
  // (<site>/nvidia/cu13/lib), CUDA 12 wheels in <site>/nvidia/cuda_nvrtc/lib.
  for (const char* pattern : {"/libnvrtc.so.*", "/../../cuda_nvrtc/lib/libnvrtc.so.*"}) {
    for (const std::string& p : Glob(absl::StrCat(dir, pattern))) {
      dlopen(p.c_str(), RTLD_LAZY | RTLD_GLOBAL);
    }
  }
}

// cudnn_frontend's dynamic mode resolves a few CUDA runtime calls itself (dlopen of
// libcudart.so.12, then .13). It must use the runtime this process already runs on, whose
// cudaDeviceProp layout matches the headers we compiled against: point it there (a user setting
// of CUDNN_FRONTEND_CUDART_LIB_NAME wins).
void PinCudartForFrontend() {
  std::string name = absl::StrCat("libcudart.so.", CUDART_VERSION / 1000);
  if (void* sym = dlsym(RTLD_DEFAULT, "cudaRuntimeGetVersion"); sym != nullptr) {
    Dl_info info;
    if (dladdr(sym, &info) != 0 && info.dli_fname != nullptr &&
        std::strstr(info.dli_fname, "libcudart") != nullptr) {
      name = info.dli_fname;
    }
  }
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", name.c_str(), /*overwrite=*/0);
}

}  // namespace

CudnnLibrary LoadCudnnLibrary() {
  CudnnLibrary lib;
  PinCudartForFrontend();
  std::vector<std::string> tried;
  for (const std::string& cand : CudnnCandidates()) {
    dlerror();
    void* h = dlopen(cand.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) {
      const char* err = dlerror();
      tried.push_back(absl::StrCat(cand, " (", err != nullptr ? err : "not found", ")"));
      continue;
    }
    if (cand.find('/') != std::string::npos) PreloadSiblings(cand);
    lib.handle = h;
    lib.path = cand;
    Dl_info info;
    void* sym = dlsym(h, "cudnnGetVersion");
    if (sym != nullptr && dladdr(sym, &info) != 0 && info.dli_fname != nullptr) {
      lib.path = info.dli_fname;
    }
    return lib;
  }
  lib.error = absl::StrCat("no libcudnn.so.9 could be loaded; tried: ", absl::StrJoin(tried, "; "),
                           ". Set ATTNSERVE_CUDNN_LIBRARY to its path or add its folder to "
                           "LD_LIBRARY_PATH");
  return lib;
}

#else  // linked against libcudnn at build time

CudnnLibrary LoadCudnnLibrary() {
  CudnnLibrary lib;
  lib.handle = reinterpret_cast<void*>(&cudnnGetVersion);
  lib.path = "libcudnn (linked)";
  return lib;
}

#endif

}  // namespace attnserve
