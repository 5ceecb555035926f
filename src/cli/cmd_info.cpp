// bie info: describe a GGUF model file (architecture, geometry, tensor types, tokenizer) from its
// header alone, so it also works on models BIE cannot run.
#include <fmt/format.h>

#include <cstdio>
#include <map>
#include <memory>

#include "bie/backend/device.h"
#include "bie/common/cpu_features.h"
#include "bie/engine/model_path.h"
#include "bie/gguf/ggml_type_info.h"
#include "bie/gguf/gguf_file.h"
#include "bie/model/model.h"
#include "bie/planner/plan_report.h"
#include "cli/commands.h"

namespace bie::cli {

namespace {

std::string meta_str(const gguf::GgufFile& f, const std::string& key) {
  const gguf::KeyValue* kv = f.find(key);
  if (kv == nullptr) return "-";
  if (auto s = f.get_string(key)) return std::string(*s);
  if (auto b = f.get_bool(key)) return *b ? "true" : "false";
  if (auto i = gguf::value_as_int(kv->value)) return std::to_string(*i);
  if (auto d = gguf::value_as_float(kv->value)) return fmt::format("{:g}", *d);
  if (const gguf::Array* a = f.get_array(key)) {
    return fmt::format("[{} x {}]", a->items.size(), gguf::value_type_name(a->elem_type));
  }
  return "?";
}

int info(const std::string& model_arg, bool show_tensors) {
  auto path = resolve_model_path(model_arg);
  if (!path.ok()) {
    std::fprintf(stderr, "bie info: %s\n", path.error().c_str());
    return kExitFailure;
  }
  auto file = gguf::GgufFile::open(*path);
  if (!file.ok()) {
    std::fprintf(stderr, "bie info: %s\n", file.error().c_str());
    return kExitFailure;
  }
  const gguf::GgufFile& f = **file;
  const std::string arch = f.architecture();
  const std::string a = arch + ".";
  bool supported = false;
  for (const auto& s : supported_architectures()) supported |= s == arch;

  fmt::print("file            {}\n", *path);
  fmt::print("size            {} (GGUF v{}, {} tensors, {} metadata keys)\n",
             planner::format_bytes(static_cast<double>(f.file_size())), f.version(),
             f.tensors().size(), f.metadata().size());
  fmt::print("name            {}\n", meta_str(f, "general.name"));
  fmt::print("architecture    {}{}\n", arch.empty() ? "-" : arch,
             supported ? "" : "  (not supported by bie run)");
  fmt::print("context length  {}\n", meta_str(f, a + "context_length"));
  fmt::print("layers          {}\n", meta_str(f, a + "block_count"));
  fmt::print("embedding       {}\n", meta_str(f, a + "embedding_length"));
  fmt::print("feed-forward    {}\n", meta_str(f, a + "feed_forward_length"));
  fmt::print("heads           {} (kv heads {})\n", meta_str(f, a + "attention.head_count"),
             meta_str(f, a + "attention.head_count_kv"));
  fmt::print("head dim        {}\n", f.find(a + "attention.key_length")
                                         ? meta_str(f, a + "attention.key_length")
                                         : "n_embd / n_head");
  fmt::print("rope            base {}, dims {}, scaling {}\n", meta_str(f, a + "rope.freq_base"),
             meta_str(f, a + "rope.dimension_count"), meta_str(f, a + "rope.scaling.type"));
  fmt::print("rms eps         {}\n", meta_str(f, a + "attention.layer_norm_rms_epsilon"));
  if (f.find(a + "attention.sliding_window")) {
    fmt::print("sliding window  {}\n", meta_str(f, a + "attention.sliding_window"));
  }
  fmt::print("output          {}\n",
             f.find_tensor("output.weight") ? "separate output.weight" : "tied to token_embd");

  std::map<std::string, std::pair<int, uint64_t>> by_type;
  uint64_t total = 0, params = 0;
  for (const auto& t : f.tensors()) {
    const auto ti = gguf::ggml_type_info(t.type);
    auto& e = by_type[ti ? std::string(ti->name) : std::to_string(t.type)];
    e.first++;
    e.second += t.n_bytes;
    total += t.n_bytes;
    params += static_cast<uint64_t>(t.n_elements());
  }
  fmt::print("parameters      {:.1f} M, {} of tensor data ({:.2f} bits per weight)\n", params / 1e6,
             planner::format_bytes(static_cast<double>(total)),
             params ? 8.0 * static_cast<double>(total) / static_cast<double>(params) : 0.0);
  for (const auto& [name, e] : by_type) {
    fmt::print("  {:<8} {:>4} tensors  {}\n", name, e.first,
               planner::format_bytes(static_cast<double>(e.second)));
  }
  const gguf::Array* toks = f.get_array("tokenizer.ggml.tokens");
  fmt::print("tokenizer       {} (pre '{}'), {} tokens, bos {}, eos {}, add_bos {}\n",
             meta_str(f, "tokenizer.ggml.model"), meta_str(f, "tokenizer.ggml.pre"),
             toks ? toks->items.size() : 0, meta_str(f, "tokenizer.ggml.bos_token_id"),
             meta_str(f, "tokenizer.ggml.eos_token_id"),
             meta_str(f, "tokenizer.ggml.add_bos_token"));
  fmt::print("chat template   {}\n", f.find("tokenizer.chat_template") ? "yes" : "no");
  fmt::print("cpu kernels     {}\n", isa_report());
  if (show_tensors) {
    for (const auto& t : f.tensors()) {
      const auto ti = gguf::ggml_type_info(t.type);
      std::string shape = std::to_string(t.ne[0]);
      for (int d = 1; d < t.n_dims; ++d) shape += fmt::format(" x {}", t.ne[d]);
      fmt::print("  {:<32} {:<8} [{}]\n", t.name, ti ? ti->name : "?", shape);
    }
  }
  return kExitOk;
}

// `bie info --devices`: the Vulkan devices (one block each), or one line saying why there are none.
int info_devices() {
  auto devices = list_vulkan_devices();
  if (!devices.ok()) {
    std::fprintf(stderr, "bie info: %s\n", devices.error().c_str());
    return kExitBadInput;
  }
  fmt::print("{}", describe_devices(*devices));
  auto chosen = resolve_device(DeviceSpec{}, devices);
  fmt::print("--device auto picks: {}\n", chosen.ok() ? chosen->description : chosen.error());
  return kExitOk;
}

}  // namespace

void add_info_command(CLI::App& root, int* rc) {
  auto model = std::make_shared<std::string>("default");
  auto tensors = std::make_shared<bool>(false);
  auto devices = std::make_shared<bool>(false);
  CLI::App* cmd = root.add_subcommand("info", "Describe a model file");
  cmd->add_option("model", *model, "GGUF file, or 'default'")->capture_default_str();
  cmd->add_option("-m,--model", *model, "GGUF file, or 'default'");
  cmd->add_flag("--tensors", *tensors, "List every tensor");
  cmd->add_flag("--devices", *devices, "List the Vulkan devices (GPUs) instead of a model");
  cmd->callback(
      [model, tensors, devices, rc] { *rc = *devices ? info_devices() : info(*model, *tensors); });
}

}  // namespace bie::cli
