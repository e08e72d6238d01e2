#include "engine/cli/rescue_target.h"

#include "engine/checkpointing.h"

namespace tf {

StatusOr<std::string> TrainerRescue::Hash() { return StateHash(trainer_); }

StatusOr<TrainerRescue::Written> TrainerRescue::Write() {
  TF_ASSIGN_OR_RETURN(TrainCheckpointing::Rescue r, trainer_.checkpointing()->RescueWrite());
  return Written{r.step, r.hash, r.already};
}

Status TrainerRescue::Commit() { return trainer_.checkpointing()->RescueCommit(); }

Status TrainerRescue::Discard() { return trainer_.checkpointing()->RescueDiscard(); }

}  // namespace tf
