// The state parts (ckpt/state_part.hpp) as the checkpoint and the elastic
// hand-over carry them: names in rng.safetensors, a checkpoint's tensors
// back by rank, and the hand-over blob.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <map>

#include "cohort/ckpt/state_part.hpp"
#include "cohort/core/error.hpp"
#include "cohort/train/lifecycle/train_state.hpp"
#include "cohort/train/optimization/precision.hpp"

using namespace cohort;

TEST(StatePart, CheckpointNamesGoBackToTheirPartAndRank) {
  EXPECT_EQ(part_tensor_name("sync", "powersgd.q.fc.weight"), "sync.powersgd.q.fc.weight");
  EXPECT_EQ(part_tensor_name("loss_scaler", ""), "loss_scaler");
  std::map<std::string, torch::Tensor> file = {
      {"rank.0", torch::zeros({4})},  // an RNG stream: no part's
      {"rank.1", torch::zeros({4})},
      {"loss_scaler", torch::ones({3})},
      {"sync.local.momentum", torch::full({2}, 7.0)},
      {"rank.0.sync.local.params", torch::full({2}, 0.0)},
      {"rank.1.sync.local.params", torch::full({2}, 1.0)},
      {"rank.1.sync", torch::full({1}, 5.0)},
      {"syncing.other", torch::ones({1})},  // another part whose name starts alike
  };
  SavedPart sync = read_saved_part(file, "sync", 2, "ckpt/rng.safetensors");
  ASSERT_EQ(sync.shared.size(), 1u);
  EXPECT_EQ(sync.shared[0].first, "local.momentum");
  ASSERT_EQ(sync.by_rank.size(), 2u);
  ASSERT_EQ(sync.by_rank[0].size(), 1u);
  EXPECT_EQ(sync.by_rank[0][0].first, "local.params");
  EXPECT_EQ(sync.by_rank[1].size(), 2u);
  EXPECT_EQ(sync.by_rank[1][0].second.item<double>(), 5.0);  // "rank.1.sync": the tensor named ""
  EXPECT_EQ(sync.by_rank[1][0].first, "");
  SavedPart scaler = read_saved_part(file, "loss_scaler", 2, "ckpt/rng.safetensors");
  ASSERT_EQ(scaler.shared.size(), 1u);
  EXPECT_EQ(scaler.shared[0].first, "");
  // A rank beyond the writer's world is a damaged file, named.
  file["rank.2.sync.local.params"] = torch::zeros({2});
  try {
    read_saved_part(file, "sync", 2, "ckpt/rng.safetensors");
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt/rng.safetensors: rank.2.sync.local.params names a rank outside"),
              std::string::npos) << e.what();
  }
}

TEST(StatePart, LossScalerGoesThroughCheckpointAndHandover) {
  LossScaler scaler(true, 1024.0);
  torch::Tensor inf = torch::full({1}, std::numeric_limits<float>::infinity());
  EXPECT_FALSE(scaler.unscale_and_update(GradientSet{{inf}}));  // backs off, one skipped
  PartState s = scaler.capture();
  ASSERT_EQ(s.shared.size(), 1u);
  // Through a checkpoint's names.
  std::map<std::string, torch::Tensor> file;
  for (const auto& [name, t] : s.shared) file[part_tensor_name(scaler.state_name(), name)] = t;
  LossScaler resumed(true);
  EXPECT_TRUE(resumed.restore(read_saved_part(file, "loss_scaler", 1, "rng.safetensors")).empty());
  EXPECT_DOUBLE_EQ(resumed.scale(), scaler.scale());
  EXPECT_EQ(resumed.skipped(), 1);
  // Through the hand-over blob, with another part's dotted and empty names.
  Handover h;
  h.state.step = 12;
  h.state.world_size = 3;
  h.optimizer = "archive";
  h.parts["loss_scaler"] = s;
  h.parts["sync"].shared = {{"local.momentum", torch::arange(4.0)}, {"", torch::ones({1})}};
  h.parts["sync"].own = {{"local.params", torch::zeros({4})}};  // stays with its process
  Handover got = decode_handover(encode_handover(h));
  EXPECT_EQ(got.state.step, 12);
  EXPECT_EQ(got.optimizer, "archive");
  ASSERT_EQ(got.parts.size(), 2u);
  ASSERT_EQ(got.parts["sync"].shared.size(), 2u);
  EXPECT_EQ(got.parts["sync"].shared[0].first, "local.momentum");
  EXPECT_TRUE(torch::equal(got.parts["sync"].shared[0].second, torch::arange(4.0)));
  EXPECT_EQ(got.parts["sync"].shared[1].first, "");
  EXPECT_TRUE(got.parts["sync"].own.empty());
  LossScaler adopted(true);
  EXPECT_EQ(adopted.adopt(got.parts["loss_scaler"]), "");
  EXPECT_DOUBLE_EQ(adopted.scale(), scaler.scale());
  // Off, it holds nothing.
  EXPECT_TRUE(LossScaler(false).capture().shared.empty());
}
