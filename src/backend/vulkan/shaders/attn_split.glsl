// The split grid of paged attention (attn_paged_kv.comp, attn_split_merge.comp): a token's keys
// [first, pos] are cut into n splits of len keys each (the last may be shorter), len the larger of
// split_min and span / n_split_max rounded up to 64 keys. The grid depends on the token's own
// position and window only, never on the batch, so a token's output does not depend on which
// tokens share its dispatch or on whether its splits ran in one workgroup or several.
// VulkanBackend::paged_attention computes the same grid on the host for the dispatch's size:
// change both together.
void split_grid(int first, int pos, uint n_split_max, uint split_min, out int len, out int n) {
  const int span = pos - first + 1;
  const int per = (span + int(n_split_max) - 1) / int(n_split_max);
  len = max(int(split_min), (per + 63) / 64 * 64);
  n = (span + len - 1) / len;
}

// One step of merging split partials in split order: (M, L) the running max and sum, (ms, ls) the
// next split's; a and b scale the running and the split's unnormalised outputs (split_apply).
// precise: the same arithmetic wherever it is compiled (one workgroup's loop, the merge pass).
void split_merge(inout float M, inout float L, float ms, float ls, out float a, out float b) {
  precise float mn = max(M, ms);
  precise float ea = exp(M - mn);  // 0 before the first split (M = -inf)
  precise float eb = exp(ms - mn);
  precise float ln = L * ea + ls * eb;
  M = mn;
  L = ln;
  a = ea;
  b = eb;
}
float split_apply(float o, float a, float acc, float b) {
  precise float r = o * a + acc * b;
  return r;
}
