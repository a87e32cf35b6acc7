// Communicator::fromEnvironment: meet through the variables the launchers
// people already use set.
#include <cstring>

#include "bootstrap/bootstrap.h"
#include "braid/communicator.h"
#include "core/errors.h"
#include "core/knobs.h"
#include "core/log.h"

namespace braid {
namespace {

struct Launch {
  const char* launcher;
  int rank;
  int size;
};

// The first launcher whose rank and size variables are both set.
Launch findLaunch() {
  static const struct {
    const char* launcher;
    const char* rank;
    const char* size;
  } kLaunchers[] = {
      {"braid-run", "BRAID_RANK", "BRAID_WORLD_SIZE"},
      {"torchrun", "RANK", "WORLD_SIZE"},
      {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"MPICH/Hydra", "PMI_RANK", "PMI_SIZE"},
      {"Slurm", "SLURM_PROCID", "SLURM_NTASKS"},
  };
  for (const auto& l : kLaunchers) {
    std::string rank = getEnv(l.rank), size = getEnv(l.size);
    if (rank.empty() || size.empty()) continue;
    Launch launch{l.launcher, static_cast<int>(parseInt(rank, l.rank)),
                  static_cast<int>(parseInt(size, l.size))};
    if (launch.size < 1 || launch.rank < 0 || launch.rank >= launch.size)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: %s=%s and %s=%s do not name a rank of the job", l.rank,
                         rank.c_str(), l.size, size.c_str()));
    return launch;
  }
  throw Error(ErrorCode::InvalidUsage,
              "braid: fromEnvironment found no launcher variables: run under braid-run, torchrun, "
              "mpirun or srun, or set BRAID_RANK, BRAID_WORLD_SIZE and BRAID_ROOT");
}

// FNV-1a over the strings every rank of one job sees alike.
uint64_t jobSecret(const std::string& root, int size) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto add = [&](const std::string& text) {
    for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
    h = (h ^ 0xff) * 0x100000001b3ull;
  };
  add(root);
  add(std::to_string(size));
  for (const char* name :
       {"BRAID_JOB_ID", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID",
        "SLURM_STEP_ID", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE"})
    add(getEnv(name));
  return h;
}

// The rendezvous address: BRAID_ROOT, else MASTER_ADDR with the port one
// above MASTER_PORT (torchrun's own store holds MASTER_PORT itself).
net::Address rootAddress() {
  if (std::string root = getEnv("BRAID_ROOT"); !root.empty())
    return net::Address::parse(root, "BRAID_ROOT");
  std::string host = getEnv("MASTER_ADDR"), port = getEnv("MASTER_PORT");
  if (host.empty() || port.empty())
    throw Error(ErrorCode::InvalidUsage,
                "braid: fromEnvironment needs the rendezvous address: set BRAID_ROOT=host:port "
                "(or MASTER_ADDR and MASTER_PORT)");
  long long number = parseInt(port, "MASTER_PORT");
  if (number < 1 || number > 65534)
    throw Error(ErrorCode::InvalidArgument, "braid: MASTER_PORT must be in 1..65534");
  bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return net::Address::parse((v6 ? "[" + host + "]" : host) + ":" + std::to_string(number + 1),
                             "MASTER_ADDR/MASTER_PORT");
}

}  // namespace

Communicator Communicator::fromEnvironment(const Config& config) {
  Launch launch = findLaunch();
  BRAID_INFO(Env, "launched by %s as rank %d of %d", launch.launcher, launch.rank, launch.size);
  if (std::string hex = getEnv("BRAID_UNIQUE_ID"); !hex.empty())
    return init(launch.size, launch.rank, UniqueId::fromHex(hex), config);

  bootstrap::IdContents contents{rootAddress(), 0};
  contents.secret = jobSecret(contents.root.toString(), launch.size);
  if (launch.rank == 0) {
    // Rank 0 hosts the rendezvous. Bind the wildcard address at the root's
    // port when the root names another interface of this host.
    Knobs knobs = Knobs::resolve(config);
    net::Address at = contents.root;
    try {
      net::Listener listener(at);
      bootstrap::startRoot(std::move(listener), contents.secret, knobs.timeout);
    } catch (const Error&) {
      at = net::Address::parse(
          (at.family() == AF_INET6 ? "[::]:" : "0.0.0.0:") + std::to_string(at.port()),
          "BRAID_ROOT");
      bootstrap::startRoot(net::Listener(at), contents.secret, knobs.timeout);
    }
  }
  return init(launch.size, launch.rank, bootstrap::encodeId(contents), config);
}

}  // namespace braid
