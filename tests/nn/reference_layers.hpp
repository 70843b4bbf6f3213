// Naive float64 references of the layers, forward and backward, written from their textbook
// definitions (direct loops, no im2col, no fused coefficients), for the layer tests. Every
// tensor is a flat std::vector<double>, row-major, samples NCHW.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace mpt::nn::test {

using Vec = std::vector<double>;
using I64 = std::int64_t;

// Conv geometry: N samples of (C, H, W), O output channels, K x K, stride S, pad P.
struct ConvRef {
  I64 n, c, h, w, o, k, s, p;
  I64 oh() const { return (h + 2 * p - k) / s + 1; }
  I64 ow() const { return (w + 2 * p - k) / s + 1; }
  I64 weights() const { return o * c * k * k; }

  // y[n,o,i,j] = b[o] + sum w[o,c,a,b] x[n,c,i*s-p+a,j*s-p+b]
  Vec forward(const Vec& weight, const Vec& bias, const Vec& x) const {
    Vec y(static_cast<std::size_t>(n * o * oh() * ow()));
    visit([&](I64 yi, I64 wi, I64 xi) {
      if (wi < 0)
        y[yi] = bias[static_cast<std::size_t>(xi)];
      else
        y[yi] += weight[wi] * x[xi];
    });
    return y;
  }
  void backward(const Vec& weight, const Vec& x, const Vec& dy, Vec& dweight, Vec& dbias,
                Vec& dx) const {
    dweight.assign(static_cast<std::size_t>(weights()), 0.0);
    dbias.assign(static_cast<std::size_t>(o), 0.0);
    dx.assign(x.size(), 0.0);
    visit([&](I64 yi, I64 wi, I64 xi) {
      if (wi < 0) {
        dbias[static_cast<std::size_t>(xi)] += dy[yi];
        return;
      }
      dweight[wi] += dy[yi] * x[xi];
      dx[xi] += dy[yi] * weight[wi];
    });
  }

 private:
  // Calls f(y index, -1, channel) once per output (the bias), then f(y, w, x) per tap in range.
  template <class F>
  void visit(const F& f) const {
    for (I64 s_ = 0; s_ < n; ++s_)
      for (I64 oc = 0; oc < o; ++oc)
        for (I64 i = 0; i < oh(); ++i)
          for (I64 j = 0; j < ow(); ++j) {
            const I64 yi = ((s_ * o + oc) * oh() + i) * ow() + j;
            f(yi, -1, oc);
            for (I64 ic = 0; ic < c; ++ic)
              for (I64 a = 0; a < k; ++a)
                for (I64 b = 0; b < k; ++b) {
                  const I64 hh = i * s - p + a, ww = j * s - p + b;
                  if (hh < 0 || hh >= h || ww < 0 || ww >= w) continue;
                  f(yi, ((oc * c + ic) * k + a) * k + b, ((s_ * c + ic) * h + hh) * w + ww);
                }
          }
  }
};

// Training-mode batch normalisation of N samples of C channels of S values: batch mean and
// biased variance per channel, eps 1e-5.
struct BatchNormRef {
  I64 n, c, s;
  double eps = 1e-5;
  void stats(const Vec& x, Vec& mean, Vec& var) const {
    mean.assign(static_cast<std::size_t>(c), 0.0);
    var.assign(static_cast<std::size_t>(c), 0.0);
    const double m = static_cast<double>(n * s);
    for (I64 k = 0; k < c; ++k) {
      for (I64 i = 0; i < n; ++i)
        for (I64 j = 0; j < s; ++j) mean[k] += x[(i * c + k) * s + j] / m;
      for (I64 i = 0; i < n; ++i)
        for (I64 j = 0; j < s; ++j) {
          const double d = x[(i * c + k) * s + j] - mean[k];
          var[k] += d * d / m;
        }
    }
  }
  // With MEAN and VAR given (eval: the running statistics), else the batch's.
  Vec forward(const Vec& gamma, const Vec& beta, const Vec& x, const Vec* mean_in = nullptr,
              const Vec* var_in = nullptr) const {
    Vec mean, var;
    stats(x, mean, var);
    if (mean_in) mean = *mean_in;
    if (var_in) var = *var_in;
    Vec y(x.size());
    for (I64 i = 0; i < n; ++i)
      for (I64 k = 0; k < c; ++k)
        for (I64 j = 0; j < s; ++j) {
          const I64 at = (i * c + k) * s + j;
          y[at] = gamma[k] * (x[at] - mean[k]) / std::sqrt(var[k] + eps) + beta[k];
        }
    return y;
  }
  // Training mode: through the batch statistics (the textbook three-term formula).
  void backward(const Vec& gamma, const Vec& x, const Vec& dy, Vec& dgamma, Vec& dbeta,
                Vec& dx) const {
    Vec mean, var;
    stats(x, mean, var);
    dgamma.assign(static_cast<std::size_t>(c), 0.0);
    dbeta.assign(static_cast<std::size_t>(c), 0.0);
    dx.assign(x.size(), 0.0);
    const double m = static_cast<double>(n * s);
    for (I64 k = 0; k < c; ++k) {
      const double inv = 1.0 / std::sqrt(var[k] + eps);
      double sum_dy = 0, sum_dy_xhat = 0;
      for (I64 i = 0; i < n; ++i)
        for (I64 j = 0; j < s; ++j) {
          const I64 at = (i * c + k) * s + j;
          sum_dy += dy[at];
          sum_dy_xhat += dy[at] * (x[at] - mean[k]) * inv;
        }
      dgamma[k] = sum_dy_xhat;
      dbeta[k] = sum_dy;
      for (I64 i = 0; i < n; ++i)
        for (I64 j = 0; j < s; ++j) {
          const I64 at = (i * c + k) * s + j;
          const double xhat = (x[at] - mean[k]) * inv;
          dx[at] = gamma[k] * inv * (dy[at] - sum_dy / m - xhat * sum_dy_xhat / m);
        }
    }
  }
};

inline Vec relu_forward(const Vec& x) {
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] > 0 ? x[i] : 0.0;
  return y;
}
inline Vec relu_backward(const Vec& x, const Vec& dy) {
  Vec dx(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) dx[i] = x[i] > 0 ? dy[i] : 0.0;
  return dx;
}
inline Vec add(const Vec& a, const Vec& b) {
  Vec y(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

// A slice [offset, offset + count) of V.
inline Vec slice(const Vec& v, std::size_t offset, std::size_t count) {
  return Vec(v.begin() + static_cast<std::ptrdiff_t>(offset),
             v.begin() + static_cast<std::ptrdiff_t>(offset + count));
}

// resblock:O[:stride=S] on N samples of (C, H, W), parameters in the layout of
// docs/model-spec.md: conv1 w,b; bn1 gamma,beta; conv2 w,b; bn2 gamma,beta; [proj w,b;
// proj_bn gamma,beta].
struct ResBlockRef {
  I64 n, c, h, w, o, s;
  bool projection() const { return c != o || s != 1; }
  ConvRef conv1() const { return {n, c, h, w, o, 3, s, 1}; }
  ConvRef conv2() const { return {n, o, conv1().oh(), conv1().ow(), o, 3, 1, 1}; }
  ConvRef proj() const { return {n, c, h, w, o, 1, s, 0}; }
  BatchNormRef bn() const { return {n, o, conv1().oh() * conv1().ow()}; }
  // Offsets of the parameter groups.
  struct Layout {
    std::size_t w1, b1, g1, be1, w2, b2, g2, be2, wp, bp, gp, bep, total;
  };
  Layout layout() const {
    Layout l{};
    std::size_t at = 0;
    const auto take = [&](std::size_t& field, I64 count) {
      field = at;
      at += static_cast<std::size_t>(count);
    };
    take(l.w1, conv1().weights());
    take(l.b1, o);
    take(l.g1, o);
    take(l.be1, o);
    take(l.w2, conv2().weights());
    take(l.b2, o);
    take(l.g2, o);
    take(l.be2, o);
    if (projection()) {
      take(l.wp, proj().weights());
      take(l.bp, o);
      take(l.gp, o);
      take(l.bep, o);
    }
    l.total = at;
    return l;
  }
  struct Trace {
    Vec a1, a2, r, a3, a4, p1, p2, sum, y;
  };
  Trace run(const Vec& params, const Vec& x) const {
    const Layout l = layout();
    const auto part = [&](std::size_t at, I64 count) {
      return slice(params, at, static_cast<std::size_t>(count));
    };
    Trace t;
    t.a1 = conv1().forward(part(l.w1, conv1().weights()), part(l.b1, o), x);
    t.a2 = bn().forward(part(l.g1, o), part(l.be1, o), t.a1);
    t.r = relu_forward(t.a2);
    t.a3 = conv2().forward(part(l.w2, conv2().weights()), part(l.b2, o), t.r);
    t.a4 = bn().forward(part(l.g2, o), part(l.be2, o), t.a3);
    if (projection()) {
      t.p1 = proj().forward(part(l.wp, proj().weights()), part(l.bp, o), x);
      t.p2 = bn().forward(part(l.gp, o), part(l.bep, o), t.p1);
      t.sum = add(t.a4, t.p2);
    } else {
      t.sum = add(t.a4, x);
    }
    t.y = relu_forward(t.sum);
    return t;
  }
  Vec forward(const Vec& params, const Vec& x) const { return run(params, x).y; }
  void backward(const Vec& params, const Vec& x, const Vec& dy, Vec& dparams, Vec& dx) const {
    const Layout l = layout();
    const auto part = [&](std::size_t at, I64 count) {
      return slice(params, at, static_cast<std::size_t>(count));
    };
    const auto put = [&](std::size_t at, const Vec& v) {
      std::copy(v.begin(), v.end(), dparams.begin() + static_cast<std::ptrdiff_t>(at));
    };
    dparams.assign(l.total, 0.0);
    const Trace t = run(params, x);
    const Vec g_sum = relu_backward(t.sum, dy);
    Vec dw, db, dg, dbe, g3, gr, g1, dx_main;
    bn().backward(part(l.g2, o), t.a3, g_sum, dg, dbe, g3);
    put(l.g2, dg);
    put(l.be2, dbe);
    conv2().backward(part(l.w2, conv2().weights()), t.r, g3, dw, db, gr);
    put(l.w2, dw);
    put(l.b2, db);
    const Vec g2 = relu_backward(t.a2, gr);
    bn().backward(part(l.g1, o), t.a1, g2, dg, dbe, g1);
    put(l.g1, dg);
    put(l.be1, dbe);
    conv1().backward(part(l.w1, conv1().weights()), x, g1, dw, db, dx_main);
    put(l.w1, dw);
    put(l.b1, db);
    if (projection()) {
      Vec gp, dx_skip;
      bn().backward(part(l.gp, o), t.p1, g_sum, dg, dbe, gp);
      put(l.gp, dg);
      put(l.bep, dbe);
      proj().backward(part(l.wp, proj().weights()), x, gp, dw, db, dx_skip);
      put(l.wp, dw);
      put(l.bp, db);
      dx = add(dx_main, dx_skip);
    } else {
      dx = add(dx_main, g_sum);
    }
  }
};

}  // namespace mpt::nn::test
