// defines: DataPlan, plan_data, balancer_options, loader_options
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/config/config.hpp"
#include "cohort/data/balance.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/data/order.hpp"
#include "cohort/distributed/world.hpp"

namespace cohort {

// A run's training samples in their global order (train.seed, data.bucket,
// data.drop-last) and how many optimizer steps it takes (train.max-steps,
// or train.epochs of that order), with warnings for the log.
struct DataPlan {
  std::unique_ptr<GlobalOrder> order;
  int64_t total_steps = 0;
  std::vector<std::string> notes;
};

// `train` must outlive the plan (data.bucket reads its lengths). ConfigError
// when data.bucket is set for samples without lengths or the step count
// overflows.
DataPlan plan_data(const Config& cfg, const Dataset& train);

// data.balance for a world of `world_size` ranks; `resumed`: the shares a
// checkpoint or an earlier world recorded (auto starts from them when they
// fit).
BalancerOptions balancer_options(const Config& cfg, int world_size, const std::vector<int64_t>& resumed);

// This rank's loader: its share of each global batch's micro-batches
// (data.micro-batch) by `shares`, with data.workers background workers.
LoaderOptions loader_options(const Config& cfg, const World& world, const std::vector<int64_t>& shares);

}  // namespace cohort
