// defines: install_stop_handlers, stop_requested
//
// SIGTERM and SIGINT ask a worker to stop at the next step boundary: the
// trainer writes a checkpoint and exits cleanly. A second signal restores the
// default action, so a stuck process can still be stopped.
#pragma once

namespace cohort {

void install_stop_handlers();
bool stop_requested();
int stop_signal();  // the signal that asked to stop, or 0
void request_stop();  // for tests

}  // namespace cohort
