// laoyao launch --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P] [--] CMD ...
// torch.distributed.run for one node: starts N ranks of CMD with the rank environment, each output
// line prefixed "[rankK]: ". `laoyao` as CMD's first word means this very binary.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "dist/launcher.hpp"

namespace laoyao::cli {
namespace {

void print_help() {
  std::printf(
      "usage: laoyao launch --nproc-per-node N [--nnodes M] [--node-rank R] [--master-addr ADDR]\n"
      "                     [--master-port PORT] [--] COMMAND [ARGS ...]\n"
      "\n"
      "Starts N ranks of COMMAND on this node, as torch.distributed.run (torchrun) does: each gets\n"
      "RANK, WORLD_SIZE (N * M), LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and\n"
      "MASTER_PORT. Every line a rank prints is prefixed with \"[rankK]: \". When a rank exits non-zero\n"
      "or dies, the others are stopped (SIGTERM, SIGKILL 5 s later) and launch exits 1 naming it.\n"
      "For several nodes run one launch per node with the same --nnodes, --master-addr and\n"
      "--master-port and each node's --node-rank (or use Slurm/OpenMPI, whose variables laoyao\n"
      "reads too). `laoyao` as COMMAND is this binary.\n"
      "\n"
      "options (torchrun's underscore spellings are accepted too):\n"
      "  --nproc-per-node N   ranks on this node (required)\n"
      "  --nnodes M           nodes in the job (default 1)\n"
      "  --node-rank R        this node's index, 0 .. M-1 (default 0)\n"
      "  --master-addr ADDR   rank 0's host (default 127.0.0.1)\n"
      "  --master-port PORT   rank 0's port (default 29500)\n"
      "\n"
      "exit status: 0 every rank exited 0; 1 a rank failed; 2 a bad option.\n");
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < lo || v > hi)
    throw UsageError(flag + " takes an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got '" +
                     text + "'");
  return v;
}

std::string self_path() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "laoyao";
  buf[n] = '\0';
  return buf;
}

}  // namespace

int cmd_launch(const Args& args) {
  dist::LaunchOptions o;
  bool have_nproc = false;
  const std::vector<std::string> flags = {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr",
                                          "--master-port"};
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      print_help();
      return 0;
    }
    if (a.rfind("--", 0) != 0) break;  // the command starts here
    std::string value;
    if (const auto eq = a.find('='); eq != std::string::npos) value = a.substr(eq + 1), a = a.substr(0, eq);
    for (char& c : a)
      if (c == '_') c = '-';  // torchrun spells them --nproc_per_node, --master_addr, ...
    bool known = false;
    for (const auto& f : flags) known = known || a == f;
    if (!known)
      throw UsageError("unknown option " + args[i] + did_you_mean(a, flags) + " (" +
                       "`laoyao launch --help` lists the options)");
    if (value.empty()) {
      if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
      value = args[++i];
    }
    if (a == "--nproc-per-node") o.nproc_per_node = parse_int(a, value, 1, 1024), have_nproc = true;
    else if (a == "--nnodes") o.nnodes = parse_int(a, value, 1, 100000);
    else if (a == "--node-rank") o.node_rank = parse_int(a, value, 0, 100000);
    else if (a == "--master-addr") o.master_addr = value;
    else o.master_port = static_cast<int>(parse_int(a, value, 1, 65535));
  }
  if (!have_nproc) throw UsageError("--nproc-per-node is required (the number of ranks to start on this node)");
  if (o.node_rank >= o.nnodes)
    throw UsageError("--node-rank " + std::to_string(o.node_rank) + " is not below --nnodes " +
                     std::to_string(o.nnodes));
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (o.command.empty()) throw UsageError("no command to launch (usage: laoyao launch --nproc-per-node N -- laoyao ...)");
  if (o.command[0] == "laoyao") o.command[0] = self_path();
  return dist::launch(o);
}

}  // namespace laoyao::cli
