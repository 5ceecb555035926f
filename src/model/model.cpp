#include "bie/model/model.h"

#include <fmt/format.h>

#include "model/architectures.h"
#include "model/model_loader.h"

namespace bie {

Result<std::span<float>> Model::forward(std::span<const int32_t> tokens, KvCache& kv,
                                        Backend& backend, ForwardOptions opts) {
  BatchSequence one;
  one.tokens = tokens;
  one.kv = &kv;
  one.logits = opts.logits_all ? BatchSequence::Logits::kAll : BatchSequence::Logits::kLast;
  one.attn_entropy = opts.attn_entropy;
  one.path = opts.path;
  auto out = forward_batch(std::span<const BatchSequence>(&one, 1), backend);
  if (out) kv.finish_pass();
  return out;
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const ArchSpec& a : architecture_table()) out.emplace_back(a.name);
  return out;
}

Result<std::unique_ptr<Model>> load_model(const std::string& path, LoadOptions opts) {
  if (opts.max_batch_tokens <= 0) return Error{"max_batch_tokens must be > 0"};
  auto file = gguf::GgufFile::open(path);
  if (!file.ok()) return Error{file.error()};
  const std::string arch = (*file)->architecture();
  if (arch.empty()) return Error{fmt::format("'{}': no general.architecture in the file", path)};
  for (const ArchSpec& a : architecture_table()) {
    if (arch != a.name) continue;
    try {
      return make_decoder_model(a, std::move(file).value(), opts);
    } catch (const model_loader::LoadError& e) {
      return Error{fmt::format("'{}' ({}): {}", path, arch, e.message)};
    } catch (const std::bad_alloc&) {
      return Error{fmt::format("'{}': out of memory while loading", path)};
    }
  }
  return Error{fmt::format("'{}': unsupported architecture '{}' (supported: {})", path, arch,
                           fmt::join(supported_architectures(), ", "))};
}

}  // namespace bie
