#pragma once

#include <string>

// File paths and the dynamic loader, as the two run-time loaders (nccl_loader.cc,
// gpu_runtime.cc) use them.
namespace ringtree::cuda {

bool startsWith(const std::string& text, const std::string& prefix);
bool pathExists(const std::string& path);
bool isDirectory(const std::string& path);
// `folder`/`name`, with one slash between them.
std::string joinPath(const std::string& folder, const std::string& name);
// The folder holding `path` ("/" for an entry directly under the root, "." for a bare name).
std::string folderOf(const std::string& path);
// dlerror()'s text (consumed), or a stand-in when it has none.
std::string dlerrorText();
// The file the dynamic loader opened for `handle`, or `fallback` when it does not say.
std::string fileOf(void* handle, const std::string& fallback);
// "<candidate>: <dlerror text>", without naming the candidate twice when the text does.
std::string loadFailure(const std::string& candidate, const std::string& error);

}  // namespace ringtree::cuda
