// The mptrain process: brings up MPI and Kokkos, dispatches the subcommand, and turns every
// failure into a one-line message and a non-zero exit on every rank.
#include <mpi.h>
#include <omp.h>

#include <Kokkos_Core.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "app/cli.hpp"
#include "app/threads.hpp"
#include "ckpt/ckpt.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/hdf5.hpp"
#include "data/data.hpp"
#include "export/export.hpp"
#include "kernels/matmul.hpp"
#include "nn/nn.hpp"
#include "train/checkpointing.hpp"

// OpenBLAS keeps its own thread pool; declared weak so that a site BLAS without it still links.
extern "C" void openblas_set_num_threads(int threads) __attribute__((weak));

namespace mpt::app {
namespace {

const char* kUsage =
    "usage: mptrain COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  train     train a model (launch with mpirun/srun for data parallelism)\n"
    "  eval      loss, top-1 and top-5 accuracy of a checkpoint on a dataset\n"
    "  export    write a checkpoint as a standalone inference file (model.h5)\n"
    "  predict   run an exported model on a dataset\n"
    "  prepare   convert a dataset to mptrain's HDF5 layout (fashion-mnist | synthetic | npy | csv)\n"
    "  inspect   print what an HDF5 data or checkpoint file holds\n"
    "  bench     benchmark a collective: `mptrain bench allreduce -b 8 -e 256M -f 2`\n"
    "\n"
    "`mptrain COMMAND --help` lists the options of a command. Options can also come from an\n"
    "INI file (--config FILE): `[optimizer] lr = 0.1` is `--optimizer.lr=0.1`; the command line wins.\n";

// This rank's compute threads: --train.threads (--threads), else OMP_NUM_THREADS, else its
// share of the cores it may run on (threads.hpp), and that share. Collective: one allgather
// over the node at start-up. Rank 0 warns when its node's threads outnumber the node's cores.
struct RankThreads {
  int threads = 1;
  int share = 1;  // the threads this rank's cores hold without oversubscribing
};
RankThreads plan_threads(const RuntimeConfig& runtime, const comm::World& world,
                         const std::string& option) {
  int requested = runtime.threads;
  if (requested == 0 && std::getenv("OMP_NUM_THREADS") != nullptr)
    requested = omp_get_max_threads();  // what the OpenMP runtime read from it
  const auto node = plan_node(gather_node_cpus(world.handle(), this_rank_cpus(requested)));
  if (world.rank() == 0) {
    const std::string warning = oversubscription_warning(node, option);
    if (!warning.empty()) std::fprintf(stderr, "%s\n", warning.c_str());
  }
  return {node.threads.at(world.local_rank()), node.shares.at(world.local_rank())};
}

// Sets the compute threads (OpenMP: oneDNN and the host kernels; OpenBLAS's own pool) and the
// matmul library, and reads the conv paths' environment variables (MPTRAIN_HOST_CONV,
// MPTRAIN_CUDA_CONV) here, in an agreed phase: read first at a conv's plan(), a bad value would
// be an error line from every rank.
void apply_runtime(const RuntimeConfig& runtime, int threads) {
  nn::host_conv_path();
  nn::cuda_conv_path();
  omp_set_num_threads(threads);
  if (openblas_set_num_threads) openblas_set_num_threads(threads);
  if (runtime.matmul == "blas") kernels::set_matmul_backend(kernels::MatmulBackend::blas);
  if (runtime.matmul == "onednn") {
    MPT_REQUIRE(kernels::dnnl_available(), "--kernels.matmul=onednn: this build has no oneDNN",
                "rebuild with libdnnl-dev installed, or use --kernels.matmul=blas");
    kernels::set_matmul_backend(kernels::MatmulBackend::dnnl);
  }
}

// What --comm.overlap=auto needs to know of the cores (comm::overlap_buckets): whether every
// rank has one beyond its compute threads. One MAX reduction, so that every rank decides alike.
void find_spare_cores(comm::CommOptions& comm, const RankThreads& threads,
                      const comm::World& world) {
  const double no_spare_core = threads.share > threads.threads ? 0 : 1;
  comm.spare_core_everywhere = world.max(no_spare_core) == 0;
}

void print_help_once(const std::string& text, const comm::World& world) {
  if (world.rank() == 0) std::printf("%s", text.c_str());
}

int dispatch(const std::vector<std::string>& args, const comm::World& world) {
  const std::string command = args.empty() ? "" : args.front();
  const std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  if (command.empty() || command == "--help" || command == "-h" || command == "help") {
    print_help_once(kUsage, world);
    return command.empty() ? 2 : 0;
  }
  if (command == "--version") {
    if (world.rank() == 0) std::printf("mptrain %s (%s)\n", MPTRAIN_VERSION, git_hash());
    return 0;
  }

  if (command == "train" || command == "eval") {
    TrainCommand parsed;
    world.run_agreed([&] { parsed = parse_train_command(command, rest); });
    if (parsed.help) {
      print_help_once(parsed.help_text, world);
      return 0;
    }
    const RankThreads threads = plan_threads(parsed.runtime, world, "--train.threads");
    world.run_agreed([&] { apply_runtime(parsed.runtime, threads.threads); });
    if (command == "train") {
      find_spare_cores(parsed.run.comm, threads, world);
      if (const char* fault = std::getenv("MPTRAIN_FAULT")) parsed.run.fault = fault;
      train::run_training(parsed.run, world);
      return 0;
    }
    const auto result = train::run_evaluation(parsed.checkpoint, parsed.run.data,
                                              parsed.run.loop.batch_size, world, parsed.confusion);
    if (world.rank() == 0)
      std::printf("eval: accuracy %.4f  top5 %.4f  loss %.4f  samples %lld  checkpoint %s  data %s\n",
                  result.accuracy, result.top5_accuracy, result.loss,
                  static_cast<long long>(result.samples), parsed.checkpoint.c_str(),
                  parsed.run.data.test_path.c_str());
    return 0;
  }

  if (command == "export") {
    ExportCommand parsed;
    world.run_agreed([&] { parsed = parse_export_command(rest); });
    if (parsed.help) {
      print_help_once(parsed.help_text, world);
      return 0;
    }
    // The file is written by rank 0 alone (the weights are the same everywhere).
    world.run_agreed([&] {
      if (world.rank() != 0) return;
      const auto file = exported::export_checkpoint(parsed.checkpoint, parsed.out);
      std::printf("export: wrote %s (model %s, %zu weight tensors, %zu buffers, sha256 %s)\n",
                  file.path.c_str(), file.model_spec.c_str(), file.weights.size(),
                  file.buffers.size(), file.sha256.c_str());
    });
    return 0;
  }

  if (command == "predict") {
    PredictCommand parsed;
    world.run_agreed([&] { parsed = parse_predict_command(rest); });
    if (parsed.help) {
      print_help_once(parsed.help_text, world);
      return 0;
    }
    const RankThreads threads = plan_threads(parsed.runtime, world, "--threads");
    world.run_agreed([&] { apply_runtime(parsed.runtime, threads.threads); });
    const auto result = train::run_prediction(parsed.predict, world);
    if (world.rank() == 0) {
      std::printf("predict: accuracy %.4f  top5 %.4f  loss %.4f  samples %lld  model %s  data %s\n",
                  result.accuracy, result.top5_accuracy, result.loss,
                  static_cast<long long>(result.samples), parsed.predict.model_path.c_str(),
                  parsed.predict.data.test_path.c_str());
      if (!parsed.predict.out_path.empty())
        std::printf("predict: wrote %s\n", parsed.predict.out_path.c_str());
    }
    return 0;
  }

  if (command == "prepare") {
    PrepareCommand parsed;
    world.run_agreed([&] { parsed = parse_prepare_command(rest); });
    if (parsed.help) {
      print_help_once(parsed.help_text, world);
      return 0;
    }
    // Preparation is serial: rank 0 writes, the others wait for the agreed outcome.
    world.run_agreed([&] {
      if (world.rank() != 0) return;
      if (parsed.kind == "npy" || parsed.kind == "csv") {
        data::ArrayConvertOptions options;
        options.num_classes = parsed.classes;
        options.sample_shape = parsed.shape;
        options.stats_from = parsed.stats_from;
        options.label_column = parsed.label_column;
        options.header = parsed.header;
        if (parsed.kind == "npy")
          data::convert_npy(parsed.samples_path, parsed.labels_path, parsed.out, options);
        else
          data::convert_csv(parsed.input_path, parsed.out, options);
        std::printf("prepare: wrote %s\n", parsed.out.c_str());
        return;
      }
      if (parsed.kind == "fashion-mnist") {
        data::prepare_fashion_mnist(parsed.source, parsed.out);
      } else {
        data::SyntheticSpec spec;
        spec.train_samples = parsed.train_samples;
        spec.test_samples = parsed.test_samples;
        spec.sample_shape = parsed.shape;
        spec.num_classes = parsed.classes;
        spec.seed = parsed.seed;
        spec.noise = static_cast<float>(parsed.noise);
        spec.dtype = dtype_from_name(parsed.dtype, "--dtype");
        data::prepare_synthetic(spec, parsed.out);
      }
      std::printf("prepare: wrote %s/train.h5 and %s/test.h5\n", parsed.out.c_str(), parsed.out.c_str());
    });
    return 0;
  }

  if (command == "bench") {
    BenchCommand parsed;
    world.run_agreed([&] { parsed = parse_bench_command(rest); });
    if (parsed.help) {
      print_help_once(parsed.help_text, world);
      return 0;
    }
    return run_bench(parsed, world);
  }

  if (command == "inspect") {
    if (rest.size() == 1 && (rest[0] == "--help" || rest[0] == "-h")) {
      print_help_once("usage: mptrain inspect FILE\n\nPrints what an mptrain data or checkpoint file (or any HDF5 file) holds:\n"
                      "datasets with shapes and dtypes, attributes, and for data files the label histogram;\n"
                      "for checkpoints the step, epoch, loss scale, world size, optimizer and data cursor,\n"
                      "and whether every dataset's checksum verifies.\n", world);
      return 0;
    }
    world.run_agreed([&] {
      MPT_REQUIRE(rest.size() == 1,
                  rest.empty() ? std::string("no file given to `mptrain inspect`")
                               : "`mptrain inspect` takes exactly one FILE",
                  "usage: mptrain inspect FILE (an mptrain data or checkpoint file)");
      if (world.rank() == 0) {
        std::printf("%s", data::inspect_file(rest[0]).c_str());
        // A checkpoint also gets its run state in words and a verdict on every checksum.
        if (const auto summary = ckpt::describe_checkpoint(rest[0]))
          std::printf("%s", summary->c_str());
      }
    });
    return 0;
  }

  world.run_agreed([&] {
    throw_user_error("unknown command '" + command + "'",
                     "commands are train, eval, export, predict, prepare, inspect and bench; see `mptrain --help`");
  });
  return 2;
}

}  // namespace

int run(int argc, char** argv) {
  // First, while this is the only thread: SIGTERM, SIGUSR1 and SIGINT go to a thread of their
  // own, never to one inside oneDNN's kernels (train/checkpointing.hpp says why).
  train::route_stop_signals_to_own_thread();
  int provided = 0;
  // SERIALIZED: the gradient all-reduce runs on comm::GradientReducer's thread while the main
  // thread computes; the two never call MPI at the same time (docs/architecture.md). `train`
  // asks for MULTIPLE, for its stall watchdog, whose thread answers and asks the other ranks
  // where they are while the others may be inside a collective; SERIALIZED still trains (the
  // watchdog then cannot name the ranks that have not arrived).
  const bool training = argc > 1 && std::string_view(argv[1]) == "train";
  MPI_Init_thread(&argc, &argv, training ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  set_process_identity(rank, size);
  if (provided < MPI_THREAD_SERIALIZED) {
    // Every rank gets the same answer from the library, so every rank stops here: no hang.
    if (rank == 0)
      std::fprintf(stderr, "%s\n", format_user_error(UserError(
          "this MPI library provides thread level " + std::to_string(provided) +
              ", mptrain needs MPI_THREAD_SERIALIZED (its gradient all-reduce runs on a thread)",
          "use an MPI built with thread support (Open MPI, MPICH and Cray MPICH all are)")).c_str());
    MPI_Finalize();
    return comm::kExitUserError;
  }
  hdf5_quiet();
  // A file-size limit (ulimit -f) then fails the write with EFBIG, which the checkpoint writer
  // reports like a full disk and survives, instead of SIGXFSZ killing the rank mid-collective.
  std::signal(SIGXFSZ, SIG_IGN);
  Kokkos::InitArguments kokkos_args;
  kokkos_args.disable_warnings = true;
  Kokkos::initialize(kokkos_args);

  int code = 0;
  {
    comm::World world;
    std::vector<std::string> args(argv + 1, argv + argc);
    try {
      code = dispatch(args, world);
    } catch (const comm::ReportedFailure& failure) {
      code = failure.exit_code();
    } catch (const UserError& error) {
      // Outside an agreed phase: peers may already wait in a collective, so stop them all.
      std::fprintf(stderr, "%s\n", format_user_error(error).c_str());
      if (world.size() > 1) MPI_Abort(MPI_COMM_WORLD, comm::kExitUserError);
      code = comm::kExitUserError;
    } catch (const std::exception& error) {
      std::fprintf(stderr, "mptrain: error: [%s] internal error: %s\n", process_where().c_str(), error.what());
      if (world.size() > 1) MPI_Abort(MPI_COMM_WORLD, comm::kExitInternalError);
      code = comm::kExitInternalError;
    }
  }
  std::fflush(stdout);
  Kokkos::finalize();
  MPI_Finalize();
  return code;
}

}  // namespace mpt::app
