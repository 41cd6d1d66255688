// Which of a repository's files m3serve reads, so a download fetches those alone: config.json,
// generation_config.json, the tokenizer files and chat template, and the safetensors weights with
// their index, at the top of the repository. Others (.bin, .pth, .gguf, images, subfolders such as
// original/) are never read, so never fetched.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace m3::hub {

enum class FileSet {
  kModel,      // config, tokenizer, weights
  kTokenizer,  // tokenizer files and chat template only (--tokenizer, tokenize, render-chat)
  kConfig,     // config.json only (plan)
};

bool is_needed(const std::string& repo_path, FileSet set);

// What a local snapshot lacks of `set` when no listing of the repository is at hand (offline):
// kModel needs config.json and the weights (every shard model.safetensors.index.json names, or
// some *.safetensors without an index); kTokenizer needs tokenizer.json or tokenizer_config.json;
// kConfig needs config.json.
// Empty when complete.
std::vector<std::string> missing_files(const std::filesystem::path& snapshot, FileSet set);

}  // namespace m3::hub
