#include "backends/cuda/library_files.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

namespace ringtree::cuda {

bool startsWith(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

bool pathExists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

bool isDirectory(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::string joinPath(const std::string& folder, const std::string& name) {
  if (!folder.empty() && folder.back() == '/') return folder + name;
  return folder + "/" + name;
}

std::string folderOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string dlerrorText() {
  const char* text = dlerror();
  return text == nullptr ? "unknown dlopen error" : text;
}

std::string fileOf(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

std::string loadFailure(const std::string& candidate, const std::string& error) {
  return startsWith(error, candidate + ":") ? error : candidate + ": " + error;
}

}  // namespace ringtree::cuda
