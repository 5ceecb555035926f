// A K row Hadamard-rotated in a private array, as kv::hadamard_rotate_scalar rotates it on the
// CPU: the butterflies stage by stage in its order (each one add or subtract), then the product
// with norm (the CPU's 1 / sqrt(head_dim)). Each step is `precise`, so the bits equal the CPU's.
float rot[512];  // the row; head_dim is at most 512

void hadamard_rotate_rot(uint d, float norm) {
  for (uint h = 1u; h < d; h *= 2u) {
    for (uint i = 0u; i < d; i += 2u * h) {
      for (uint j = i; j < i + h; ++j) {
        const float a = rot[j], b = rot[j + h];
        precise float s = a + b, t = a - b;
        rot[j] = s;
        rot[j + h] = t;
      }
    }
  }
  for (uint i = 0u; i < d; ++i) {
    precise float x = rot[i] * norm;
    rot[i] = x;
  }
}
