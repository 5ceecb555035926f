#version 450
// x[i] = cap * tanh(x[i] / cap) (Gemma's logit soft-capping), i < n.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform P { uint n; float cap; } p;
void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * 65535u * 256u;
  if (i < p.n) x[i] = p.cap * tanh(x[i] / p.cap);
}
