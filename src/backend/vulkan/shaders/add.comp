#version 450
// x[i] += y[i], i < n.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Yb { float y[]; };
layout(push_constant) uniform P { uint n; } p;
void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * 65535u * 256u;
  if (i < p.n) x[i] += y[i];
}
