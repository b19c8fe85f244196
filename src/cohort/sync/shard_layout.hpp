// defines: ShardLayout, shard_memory_weight, agree_shard_weights
//
// dist.shard: how the trainable parameters, laid end to end in registration
// order (the flat order), are split into contiguous ranges, one per replica
// group. With dist.shard-replicas = R the world's ranks form G = world / R
// groups (at least one): rank r belongs to group r % G, so the members of a
// group sit on different nodes when every node runs the same number of
// ranks, and ranks 0..G-1 are the groups' primaries. Every member of a group
// holds and updates the same range; a range's size follows its group's
// weight (the smallest of its members', since each must hold it).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cohort/config/config.hpp"
#include "cohort/distributed/world.hpp"

namespace cohort {

class Comm;

struct ShardLayout {
  std::vector<int64_t> numels;  // trainable parameters in the flat order
  std::vector<double> weights;  // per rank, as agreed
  int replicas = 1;
  std::vector<int64_t> bounds;  // per group g: its range is [bounds[g], bounds[g+1])

  // Splits sum(numels) by `weights` (one per rank) over the groups.
  static ShardLayout make(std::vector<int64_t> numels, std::vector<double> weights, int replicas);

  int world() const { return static_cast<int>(weights.size()); }
  int groups() const { return static_cast<int>(bounds.size()) - 1; }
  int group_of(int rank) const { return rank % groups(); }
  bool primary(int rank) const { return rank < groups(); }
  std::vector<int> members(int group) const;
  int64_t total() const { return bounds.back(); }
  int64_t lo(int group) const { return bounds.at(group); }
  int64_t hi(int group) const { return bounds.at(group + 1); }

  // A piece of one parameter inside a flat range: elements [offset,
  // offset+length) of parameter `param` (flattened), at position `at` of
  // the range.
  struct Segment {
    size_t param;
    int64_t offset;
    int64_t length;
    int64_t at;
  };
  std::vector<Segment> segments(int64_t lo, int64_t hi) const;
  // Where each parameter starts in the flat order.
  std::vector<int64_t> starts() const;

  // "dist.shard: optimizer, 2 group(s) x 1 replica: rank 0 [0, 3.1M) 66.7%, ..."
  std::string describe(const std::string& mode) const;
};

// This rank's memory for dist.shard-weights = auto, in GiB rounded to
// 1/16: on CUDA the device's free memory; on the CPU dist.max-memory-gb
// (or the node's MemAvailable) divided among the node's local ranks.
double shard_memory_weight(const DistOptions& dist, const World& world);

// The weights every rank of `comm` uses: dist.shard-weights as given (one
// per rank of the world, checked against its size; a group, an island say,
// takes its members') or each rank's shard_memory_weight, pooled with one
// all-reduce.
std::vector<double> agree_shard_weights(Comm& comm, const DistOptions& dist);

}  // namespace cohort
