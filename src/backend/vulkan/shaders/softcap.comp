#version 450
// x[r][c] = cap * tanh(x[r][c] / cap) (Gemma's logit soft-capping; s = cap). Group y = row.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform P { uint rows; uint cols; uint x_off; uint x_stride; float s; } p;
void main() {
  const uint c = gl_GlobalInvocationID.x, r = gl_GlobalInvocationID.y;
  if (c >= p.cols || r >= p.rows) return;
  const uint i = p.x_off + r * p.x_stride + c;
  x[i] = p.s * tanh(x[i] / p.s);
}
