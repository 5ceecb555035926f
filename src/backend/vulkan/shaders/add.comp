#version 450
// x[r][c] += y[r][c] (y_stride 0: y's one row broadcast over x's rows). Group y = row.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Yb { float y[]; };
layout(push_constant) uniform P {
  uint rows; uint cols; uint x_off; uint x_stride; uint y_off; uint y_stride;
} p;
void main() {
  const uint c = gl_GlobalInvocationID.x, r = gl_GlobalInvocationID.y;
  if (c < p.cols && r < p.rows) x[p.x_off + r * p.x_stride + c] += y[p.y_off + r * p.y_stride + c];
}
