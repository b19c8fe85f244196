#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/train/loop/trainer_parts.hpp"

namespace cohort {

// Elastic: this process's state at the last completed step, and the step's
// records; dist.sync = local: at the last sync.
std::shared_ptr<const Handover> Trainer::Parts::handover() const {
  log->settle();  // a diverged step is named in this world, not handed to the next
  std::shared_ptr<Handover> h;
  auto capture = [&] {
    h = capture_handover(*task->module(), *optimizer, state, state_parts(), world.world_size,
                         task->train_set().size());
  };
  if (sync_mark) {
    replicas->with_synced(capture);
    rewind_to_sync(*h, *sync_mark, state.step);
  } else {
    capture();
    h->rng = rng_mark.defined() ? rng_mark.clone() : cpu_rng_state();
    h->step_cursor = step_cursor;
    // The step's line: built already (its collectives may have failed, or
    // rank 0 may have died before writing it), or due and not built yet (a
    // collective before it failed: data.balance's measurement, say).
    if (last_line && last_line->step == state.step) h->train_line = last_line;
    else if (state.step > world_start_step && line_due()) h->train_line = log->line(state, step_cursor.epoch);
    h->interval = log->interval().tally;
    if (replicas->local()) {  // resumed mid-window, no sync since
      h->note = "local sync: no sync since this world began: the new world goes on from rank 0's parameters (the "
                "other ranks' open windows are lost)";
    }
  }
  h->first_step = log->start_step();
  h->started = log->start();
  return h;
}

// dist.sync = local: every rank holds the same parameters now.
void Trainer::Parts::mark_sync() {
  sync_mark = SyncMark{state.step, state.cursor, step_cursor, state.samples_seen,
                       rng_mark.defined() ? rng_mark.clone() : cpu_rng_state(), log->interval().tally, std::nullopt};
}

// Elastic: newcomers that the last stop check found waiting are admitted
// now, at the step boundary: this world ends and the next one includes them.
void Trainer::Parts::admit_joiners() const {
  if (!joiners_agreed || state.step >= total_steps) return;
  throw MembershipChanged(strf("step %lld: node(s) asked to join", static_cast<long long>(state.step)));
}

}  // namespace cohort
