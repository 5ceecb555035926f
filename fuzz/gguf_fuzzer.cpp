// libFuzzer target for the GGUF reader: `make fuzz` builds it with clang and runs it for a minute.
#include <cstddef>
#include <cstdint>

#include "bie/gguf/gguf_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = bie::gguf::GgufFile::from_memory(data, size);
  if (f.ok()) {
    for (const auto& t : (*f)->tensors()) {
      const uint8_t* p = (*f)->tensor_data(t);
      volatile uint8_t sink = t.n_bytes > 0 ? p[t.n_bytes - 1] : 0;  // touch the last byte
      (void)sink;
    }
  }
  return 0;
}
