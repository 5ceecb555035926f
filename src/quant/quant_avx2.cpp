#include "quant/quant_internal.h"
namespace bie::quant {
const TypeTraits* avx2_table() {
  return nullptr;
}
}  // namespace bie::quant
