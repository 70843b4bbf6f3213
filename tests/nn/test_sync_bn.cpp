// Synchronised BatchNorm across MPI ranks: with a StatsReducer that sums over MPI_COMM_WORLD,
// W ranks holding consecutive slices of one batch must produce the outputs, input-side
// gradients (summed over ranks, as the gradient all-reduce does) and running statistics of one
// process holding the whole batch with local BatchNorm.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/softmax_xent.hpp"
#include "nn/nn.hpp"
#include "tests/nn/gradcheck_util.hpp"

namespace mpt::nn {
namespace {

std::vector<double> values_of(const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    out[static_cast<std::size_t>(i)] = t.data<float>()[i];
  return out;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::fabs(e));
  return m;
}

TEST(SyncBatchNorm, SlicesOnRanksEqualTheWholeBatchOnOneRank) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // BN2d in a block and before it, BN1d after gap+dense: every kind of statistics.
  const std::string spec = "conv:4:3:pad=1,bn,relu,resblock:6:stride=2,gap,dense:5,bn,dense:3";
  const Shape sample{2, 6, 6};
  const std::int64_t local = 3, global = local * world, features = 2 * 6 * 6;
  Tensor x({global, 2, 6, 6}, DType::f32), r({global, 3}, DType::f32);
  test::fill_uniform(x, 90, -1.f, 2.f, 0);
  test::fill_uniform(r, 91, -1.f, 1.f, 0);

  // Reference: the whole batch, local statistics.
  Model whole = Model::build(spec, sample, 3);
  whole.init_params(5);
  whole.plan(global);
  const std::vector<double> whole_logits = values_of(whole.forward(x, true));
  whole.backward(r);
  const std::vector<double> whole_grads = values_of(whole.grads());

  // This rank's slice, statistics summed across ranks.
  Model synced = Model::build(spec, sample, 3);
  synced.init_params(5);
  synced.plan(local);
  int calls = 0;
  synced.set_stats_reducer([&calls](Tensor& sums) {
    ++calls;
    MPI_Allreduce(MPI_IN_PLACE, sums.raw(), static_cast<int>(sums.numel()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  });
  Tensor x_slice = Tensor::view(x, rank * local * features, {local, 2, 6, 6});
  Tensor r_slice = Tensor::view(r, rank * local * 3, {local, 3});
  const std::vector<double> logits = values_of(synced.forward(x_slice, true));
  synced.backward(r_slice);
  // Forward: 5 BN layers (bn1, three in the projecting block, bn after dense); backward: 5 more.
  EXPECT_EQ(calls, 10);
  Tensor grads = synced.grads();
  MPI_Allreduce(MPI_IN_PLACE, grads.raw(), static_cast<int>(grads.numel()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);

  // f32 sums in a different order (per rank, then across): agreement to ~1e-5 of each scale.
  const double logit_scale = max_abs(whole_logits);
  for (std::int64_t i = 0; i < local * 3; ++i)
    EXPECT_NEAR(logits[static_cast<std::size_t>(i)],
                whole_logits[static_cast<std::size_t>(rank * local * 3 + i)], 1e-5 * logit_scale)
        << i;
  const auto named = synced.named_working_params();
  const auto named_whole = whole.named_working_params();
  // Every bias here but the last layer's feeds a BN, which removes constant shifts: their true
  // gradient is zero and what both runs compute is cancellation noise, held to 1e-5 of the
  // gradients' scale. The rest must agree to 2e-5 of their own scale.
  const double all_scale = max_abs(whole_grads);
  for (std::size_t p = 0; p < named.size(); ++p) {
    const std::vector<double> got = values_of(named[p].grad);
    const std::vector<double> want = values_of(named_whole[p].grad);
    const std::string& name = named[p].name;
    const bool zero_true_gradient =
        name.size() > 5 && name.compare(name.size() - 5, 5, "/bias") == 0 && name != "dense7/bias";
    const double bound = zero_true_gradient ? 1e-5 * all_scale : 2e-5 * max_abs(want);
    if (!zero_true_gradient) {
      EXPECT_GT(max_abs(want), 1e-3 * all_scale) << name;
    }
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], bound) << name << " " << i;
  }
  // Running statistics: those of the whole batch, on every rank.
  const std::vector<double> buffers = values_of(synced.buffers());
  const std::vector<double> whole_buffers = values_of(whole.buffers());
  for (std::size_t i = 0; i < buffers.size(); ++i)
    EXPECT_NEAR(buffers[i], whole_buffers[i], 1e-5 * std::max(1.0, std::fabs(whole_buffers[i])))
        << synced.named_buffers()[0].name << "... element " << i;
}

}  // namespace
}  // namespace mpt::nn
