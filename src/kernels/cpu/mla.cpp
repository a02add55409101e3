// Multi-latent attention's query, key and value (Megatron-Core's MLASelfAttention,
// qkv_up_proj_and_rope_apply on the unfused path), built from the up projections' rows.
//
// Per token t and head h, with dqk = qk_head_dim, dr = qk_pos_emb_head_dim, dv = v_head_dim:
//   q[t]  = [head 0: q_no_pe (dqk), q_pos_emb (dr) | head 1: ...]   (linear_q_proj / linear_q_up_proj)
//   kv[t] = [head 0: k_no_pe (dqk), value (dv) | head 1: ...]       (linear_kv_up_proj)
//   k_pe[t]: the dr columns of linear_kv_down_proj after the kv latent, one for all heads
//   query[t, h] = [q_no_pe, rope(q_pos_emb)], key[t, h] = [k_no_pe, rope(k_pe)], value[t, h].
// rope is apply_rotary_pos_emb with mla_rotary_interleaved: the rotated part x[0:rot_dim] is first
// de-interleaved into [x0, x2, x4, ..., x1, x3, ...], then rotated as rotate_half's form
// (out[i] = a cos - b sin, out[i + half] = b cos + a sin for the pair a = x[2i], b = x[2i + 1]),
// and left in that order (mla_output_remove_interleaving off: q and k share the order, so their
// dot products are those of the interleaved pairs). YaRN's mscale is in the table's cos and sin.
// Each product is rounded to fp32, then the sum, as the unfused torch ops compute it.
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/ops.hpp"

namespace laoyao::kernels::cpu {
namespace {

inline float f32(double x) { return static_cast<float>(x); }
inline float mul(float a, float b) { return f32(static_cast<double>(a) * b); }
inline float add(float a, float b) { return f32(static_cast<double>(a) + b); }

void check_mla_args(const char* what, const int64_t* positions, const RopeTable& table, int64_t T, int64_t H,
                    int64_t dqk, int64_t dr, int64_t dv) {
  if (H <= 0 || dqk <= 0 || dr <= 0 || dv <= 0)
    throw Error(std::string(what) + ": heads, qk_head_dim, qk_pos_emb_head_dim and v_head_dim must be positive");
  if (table.rot_dim > dr || table.rot_dim % 2 != 0)
    throw Error(std::string(what) + ": the rotary table rotates " + std::to_string(table.rot_dim) +
                " dims but qk_pos_emb_head_dim is " + std::to_string(dr));
  for (int64_t t = 0; t < T; ++t)
    if (positions[t] < 0 || positions[t] >= table.max_positions)
      throw Error(std::string(what) + ": position " + std::to_string(positions[t]) + " at token " + std::to_string(t) +
                  " is outside the rotary table's positions [0, " + std::to_string(table.max_positions) + ")");
}

// out = rope(x) (forward) for dr values; x and out distinct.
void rope_interleaved(const float* x, float* out, const float* c, const float* s, int64_t half, int64_t dr) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    out[i] = add(mul(a, c[i]), mul(-b, s[i]));
    out[i + half] = add(mul(b, c[i]), mul(a, s[i]));
  }
  for (int64_t i = 2 * half; i < dr; ++i) out[i] = x[i];
}

// dx = rope^T(dout): the inverse rotation (-sin), then back to the interleaved order.
void rope_interleaved_backward(const float* dout, float* dx, const float* c, const float* s, int64_t half,
                               int64_t dr) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = dout[i], b = dout[i + half];
    dx[2 * i] = add(mul(a, c[i]), mul(b, s[i]));
    dx[2 * i + 1] = add(mul(b, c[i]), mul(-a, s[i]));
  }
  for (int64_t i = 2 * half; i < dr; ++i) dx[i] = dout[i];
}

}  // namespace

void mla_qkv_forward(const float* q, const float* kv, const float* k_pe, int64_t k_pe_ld, const int64_t* positions,
                     const RopeTable& table, float* query, float* key, float* value, int64_t T, int64_t H, int64_t dqk,
                     int64_t dr, int64_t dv) {
  check_mla_args("mla_qkv_forward", positions, table, T, H, dqk, dr, dv);
  const int64_t dq = dqk + dr, half = table.rot_dim / 2;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* c = table.cos.data() + positions[t] * half;
    const float* s = table.sin.data() + positions[t] * half;
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q + (t * H + h) * dq;
      const float* kvh = kv + (t * H + h) * (dqk + dv);
      float* qo = query + (t * H + h) * dq;
      float* ko = key + (t * H + h) * dq;
      for (int64_t d = 0; d < dqk; ++d) qo[d] = qh[d], ko[d] = kvh[d];
      rope_interleaved(qh + dqk, qo + dqk, c, s, half, dr);
      // The shared RoPE key: rotated once, into head 0's key, and copied to the others'.
      if (h == 0)
        rope_interleaved(k_pe + t * k_pe_ld, ko + dqk, c, s, half, dr);
      else
        for (int64_t d = 0; d < dr; ++d) ko[dqk + d] = key[t * H * dq + dqk + d];
      for (int64_t d = 0; d < dv; ++d) value[(t * H + h) * dv + d] = kvh[dqk + d];
    }
  }
}

void mla_qkv_backward(const float* dquery, const float* dkey, const float* dvalue, const int64_t* positions,
                      const RopeTable& table, float* dq_out, float* dkv, float* dk_pe, int64_t dk_pe_ld, int64_t T,
                      int64_t H, int64_t dqk, int64_t dr, int64_t dv) {
  check_mla_args("mla_qkv_backward", positions, table, T, H, dqk, dr, dv);
  const int64_t dq = dqk + dr, half = table.rot_dim / 2;
#pragma omp parallel
  {
    std::vector<double> sum(static_cast<size_t>(dr));  // (per thread, outside the token loop)
    std::vector<float> rot(static_cast<size_t>(dr));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* c = table.cos.data() + positions[t] * half;
      const float* s = table.sin.data() + positions[t] * half;
      // k_pe serves every head: its gradient is the heads' sum (in head order), then rotated back.
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t h = 0; h < H; ++h) {
        const float* dqo = dquery + (t * H + h) * dq;
        const float* dko = dkey + (t * H + h) * dq;
        float* dqh = dq_out + (t * H + h) * dq;
        float* dkvh = dkv + (t * H + h) * (dqk + dv);
        for (int64_t d = 0; d < dqk; ++d) dqh[d] = dqo[d], dkvh[d] = dko[d];
        rope_interleaved_backward(dqo + dqk, dqh + dqk, c, s, half, dr);
        for (int64_t d = 0; d < dr; ++d) sum[static_cast<size_t>(d)] += dko[dqk + d];
        for (int64_t d = 0; d < dv; ++d) dkvh[dqk + d] = dvalue[(t * H + h) * dv + d];
      }
      for (int64_t d = 0; d < dr; ++d) rot[static_cast<size_t>(d)] = f32(sum[static_cast<size_t>(d)]);
      rope_interleaved_backward(rot.data(), dk_pe + t * dk_pe_ld, c, s, half, dr);
    }
  }
}

void copy_columns(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * dst_ld + c] = src[r * src_ld + c];
}

}  // namespace laoyao::kernels::cpu
