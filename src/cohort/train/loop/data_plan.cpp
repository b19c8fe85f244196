#include "cohort/train/loop/data_plan.hpp"

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"

namespace cohort {

DataPlan plan_data(const Config& cfg, const Dataset& train) {
  DataPlan plan;
  Bucketing bucketing;
  if (cfg.data.bucket > 0) {
    COHORT_CHECK(train.size() == 0 || train.length(0) >= 0, ConfigError,
                 "data.bucket needs samples with lengths; train.task ", cfg.train.task, " has none");
    bucketing = {cfg.data.bucket, [&train](int64_t i) { return train.length(i); }};
  }
  plan.order = std::make_unique<GlobalOrder>(train.size(), cfg.data.global_batch, cfg.train.seed, cfg.data.drop_last,
                                             std::move(bucketing));
  if (cfg.data.global_batch > train.size()) {
    plan.notes.push_back(strf("warning: data.global-batch %lld is larger than the training split (%lld samples): "
                              "each step takes the whole split",
                              static_cast<long long>(cfg.data.global_batch), static_cast<long long>(train.size())));
  }
  if (cfg.train.max_steps > 0) {
    plan.total_steps = cfg.train.max_steps;
  } else {
    const int64_t per_epoch = plan.order->steps_per_epoch();
    COHORT_CHECK(!__builtin_mul_overflow(cfg.train.epochs, per_epoch, &plan.total_steps), ConfigError,
                 "train.epochs ", cfg.train.epochs, " x ", per_epoch, " steps per epoch overflows");
  }
  return plan;
}

BalancerOptions balancer_options(const Config& cfg, int world_size, const std::vector<int64_t>& resumed) {
  BalancerOptions o;
  o.mode = cfg.data.balance;
  o.micro_batches = MicroBatches{cfg.data.micro_batch}.count(cfg.data.global_batch);
  o.world_size = world_size;
  o.weights = cfg.data.balance_weights;
  o.resumed = resumed;
  return o;
}

LoaderOptions loader_options(const Config& cfg, const World& world, const std::vector<int64_t>& shares) {
  LoaderOptions o;
  o.rank = world.rank;
  o.world_size = world.world_size;
  o.micro_batch = cfg.data.micro_batch;
  o.shares = shares;
  o.workers = cfg.data.workers;
  o.prefetch = cfg.data.prefetch;
  o.pin_memory = world.device.is_cuda();
  return o;
}

}  // namespace cohort
