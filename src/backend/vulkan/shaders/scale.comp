#version 450
// x[i] *= s, i < n.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform P { uint n; float s; } p;
void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * 65535u * 256u;
  if (i < p.n) x[i] *= p.s;
}
