#include "model/mcore/parallel_linear.hpp"

#include "core/rng.hpp"

namespace laoyao::model::mcore {

DropoutSpec Step::dropout(double p, const std::string& site) const {
  if (!training) return {};
  return dropout_spec(p, seed, (site + "." + std::to_string(call)).c_str());
}

std::string dropout_site(int64_t layer, const char* what) {
  return "dropout.layer" + std::to_string(layer) + "." + what;
}

DropoutSpec attention_dropout(const ModuleContext& m, const Step& st, int64_t layer) {
  // [b, heads, queries, keys]: under context parallelism this rank's query rows of every key.
  const int64_t s = st.batch.s, keys = s * st.batch.cp_size;
  const uint64_t whole_run = static_cast<uint64_t>(m.whole.heads * s * keys);
  const DropoutSpec d = sliced(st.dropout(m.local.attention_dropout, dropout_site(layer, "probs")), whole_run,
                               static_cast<uint64_t>(m.tp.rank), static_cast<uint64_t>(m.tp.size));
  return context_parallel(d, static_cast<uint64_t>(s / 2 * keys), static_cast<uint64_t>(st.batch.cp_rank),
                          static_cast<uint64_t>(st.batch.cp_size));
}

DropoutSpec hidden_dropout(const ModuleContext& m, const Step& st, const std::string& site) {
  DropoutSpec d = st.dropout(m.local.hidden_dropout, site);
  if (m.sp())
    d = sliced(d, static_cast<uint64_t>(st.batch.s * m.local.hidden), static_cast<uint64_t>(m.tp.rank),
               static_cast<uint64_t>(m.tp.size));
  return context_parallel_rows(d, st, m.local.hidden);
}

DropoutSpec context_parallel_rows(const DropoutSpec& d, const Step& st, int64_t width) {
  return context_parallel(d, static_cast<uint64_t>(st.batch.s / 2 * width), static_cast<uint64_t>(st.batch.cp_rank),
                          static_cast<uint64_t>(st.batch.cp_size));
}

void reduce_bias_dropout_add(const ModuleContext& m, const Step& st, int64_t b, Act residual, Act out,
                             const DropoutSpec& drop, Scratch& w) {
  const int64_t h = m.local.hidden;
  Backend& be = m.backend;
  Act sum = w.branch;
  if (m.sp()) {
    be.sp_reduce_scatter(w.branch, w.local, st.batch, h);
    sum = w.local;
  } else if (m.tensor_parallel()) {
    be.tp_all_reduce(w.branch, st.batch.T * h);
  }
  be.bias_dropout_add(sum, b, residual, out, st.batch.rows, h, drop);
}

void row_parallel_bias_dropout_add(const ModuleContext& m, const Step& st, Act x, int64_t w, int64_t b, int64_t K,
                                   Act residual, Act out, const DropoutSpec& drop, Scratch& s) {
  const int64_t h = m.local.hidden;
  if (!m.tensor_parallel())
    return m.backend.linear_bias_dropout_add(x, w, b, residual, out, st.batch.T, K, h, drop);
  // Each rank's partial product over its input columns; the bias once, after the sum.
  m.backend.linear(x, w, -1, s.branch, st.batch.T, K, h);
  reduce_bias_dropout_add(m, st, b, residual, out, drop, s);
}

Act branch_output_grad(const ModuleContext& m, const Step& st, Act dout, const DropoutSpec& drop, Scratch& s) {
  const int64_t h = m.local.hidden;
  if (!m.sp()) {
    if (!(drop.p > 0)) return dout;  // read only, before the norm's backward adds to it
    m.backend.dropout(dout, s.dbranch, st.batch.rows * h, drop);
    return s.dbranch;
  }
  Act local = dout;
  if (drop.p > 0) m.backend.dropout(dout, s.local, st.batch.rows * h, drop), local = s.local;
  m.backend.sp_gather(local, s.dbranch, st.batch, h);  // the bias gradient is the whole sequence's too
  return s.dbranch;
}

Act sum_input_grad(const ModuleContext& m, const Step& st, Scratch& s) {
  const int64_t h = m.local.hidden;
  if (m.sp()) {
    m.backend.sp_reduce_scatter(s.dnorm, s.local, st.batch, h);
    return s.local;
  }
  if (m.tensor_parallel()) m.backend.tp_all_reduce(s.dnorm, st.batch.T * h);
  return s.dnorm;
}

void norm_whole_sequence(const ModuleContext& m, const Step& st, Act x, int64_t w, int64_t b, Act y, float* mean,
                         float* rstd, Scratch& s) {
  if (!m.sp()) return m.backend.norm(x, w, b, y, mean, rstd, st.batch.rows, m.local.hidden);
  m.backend.norm(x, w, b, s.local, mean, rstd, st.batch.rows, m.local.hidden);
  m.backend.sp_gather(s.local, y, st.batch, m.local.hidden);
}

uint64_t random_logits_key(uint64_t seed, uint64_t call, int64_t layer) {
  const std::string stream = "router.layer" + std::to_string(layer) + ".random_logits." + std::to_string(call);
  return rng_stream_key(seed, stream);
}

}  // namespace laoyao::model::mcore
