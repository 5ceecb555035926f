#version 450
// gate[i] = act(gate[i]) * u: SiLU (OP_SILU) or GELU-tanh (OP_GELU) the way ggml's CPU geglu
// computes it (on the fp16-rounded input, result rounded to fp16; 0 below -10, identity above 10).
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer G { float gate[]; };
layout(std430, binding = 1) readonly buffer U { float up[]; };
layout(push_constant) uniform P {
  uint rows; uint cols; uint g_off; uint g_stride; uint u_off; uint u_stride;
} p;
float round_f16(float v) { return unpackHalf2x16(packHalf2x16(vec2(v, 0.0))).x; }
void main() {
  const uint c = gl_GlobalInvocationID.x, r = gl_GlobalInvocationID.y;
  if (c >= p.cols || r >= p.rows) return;
  const uint i = p.g_off + r * p.g_stride + c;
  const float u = up[p.u_off + r * p.u_stride + c];
  const float g = gate[i];
#if defined(OP_SILU)
  gate[i] = g / (1.0 + exp(-g)) * u;
#else
  if (g <= -10.0) {
    gate[i] = 0.0;
  } else if (g >= 10.0) {
    gate[i] = g * u;
  } else {
    const float xh = round_f16(g);
    const float a = 0.79788456080286535588 * xh * (1.0 + 0.044715 * xh * xh);
    gate[i] = round_f16(0.5 * xh * (1.0 + tanh(a))) * u;
  }
#endif
}
