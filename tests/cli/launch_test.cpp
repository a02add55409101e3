// `laoyao launch`: the ranks' environment, prefixed output, and a failing rank stopping the others
// quickly (never a hang).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "run_binary.hpp"

using laoyao::test::run_laoyao;

TEST(Launch, StartsTheRanksWithTorchrunsEnvironment) {
  const auto r = run_laoyao({"launch", "--nproc-per-node", "3", "--", "sh", "-c",
                             "echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE "
                             "master=$MASTER_ADDR:$MASTER_PORT"});
  EXPECT_EQ(r.status, 0) << r.output;
  for (int k = 0; k < 3; ++k)
    EXPECT_NE(r.output.find("[rank" + std::to_string(k) + "]: rank=" + std::to_string(k) +
                            " world=3 local=" + std::to_string(k) + "/3 master=127.0.0.1:29500"),
              std::string::npos)
        << r.output;
}

TEST(Launch, SecondNodeRanksAndTorchrunSpellings) {
  const auto r = run_laoyao({"launch", "--nproc_per_node=2", "--nnodes", "2", "--node_rank", "1", "--master_addr",
                             "node0", "--master-port=6001", "sh", "-c", "echo r=$RANK w=$WORLD_SIZE g=$GROUP_RANK"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank2]: r=2 w=4 g=1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank3]: r=3 w=4 g=1"), std::string::npos) << r.output;
}

TEST(Launch, AFailingRankStopsTheOthersAndIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_laoyao({"launch", "--nproc-per-node", "3", "--", "sh", "-c",
                             "if [ \"$RANK\" = 1 ]; then echo failing; exit 3; fi; sleep 60"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_LT(seconds, 20.0) << "the sleeping ranks must be stopped, not waited for";
  EXPECT_NE(r.output.find("[rank1]: failing"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 exited with status 3; the other ranks were stopped"), std::string::npos)
      << r.output;
}

TEST(Launch, LaoyaoAsTheCommandIsThisBinary) {
  const auto r = run_laoyao({"launch", "--nproc-per-node", "2", "--", "laoyao", "recipes"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank1]: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("vanilla_gpt_pretrain_config"), std::string::npos) << r.output;
}

TEST(Launch, BadOptionsExitTwoWithAMessage) {
  auto r = run_laoyao({"launch", "--nproc-per-node", "0", "--", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--nproc-per-node takes an integer from 1"), std::string::npos) << r.output;
  r = run_laoyao({"launch", "--nproc-per-nod", "2", "--", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--nproc-per-node"), std::string::npos) << r.output;
  r = run_laoyao({"launch", "--nproc-per-node", "2"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("no command to launch"), std::string::npos) << r.output;
  r = run_laoyao({"launch", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "--", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--node-rank 2 is not below --nnodes 2"), std::string::npos) << r.output;
  r = run_laoyao({"launch", "--nproc-per-node", "1", "--", "/nonexistent/program"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("cannot run '/nonexistent/program'"), std::string::npos) << r.output;
}
