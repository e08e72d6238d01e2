// The rescue exchange of `trainflow launch` (launch/rank_agent.h) over a failed trainer's state
// (engine/checkpointing.h: RescueWrite, RescueCommit, RescueDiscard, StateHash).
#pragma once
#include "engine/trainer.h"
#include "launch/rank_agent.h"

namespace tf {

class TrainerRescue final : public launch::RescueTarget {
 public:
  explicit TrainerRescue(Trainer& trainer) : trainer_(trainer) {}
  int64_t step() const override { return trainer_.step(); }
  bool rescuable() const override { return trainer_.checkpointing() != nullptr; }
  StatusOr<std::string> Hash() override;
  StatusOr<Written> Write() override;
  Status Commit() override;
  Status Discard() override;

 private:
  Trainer& trainer_;
};

}  // namespace tf
